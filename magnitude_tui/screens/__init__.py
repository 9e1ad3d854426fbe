"""The app's screens: the workspace and its dialogs."""
