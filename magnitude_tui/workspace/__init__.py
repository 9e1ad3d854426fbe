"""The workspace without Textual: its model (panes, turns, conversations) and the app's event pump."""
