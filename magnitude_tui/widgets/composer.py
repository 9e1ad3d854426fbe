"""Provides the one-line message composer at the bottom of each pane."""

from __future__ import annotations

from textual.widgets import Input


class Composer(Input):
    """Where the user types a message or a slash command (/spawn N task, /burst N, /policy P)."""

    DEFAULT_CSS = """
    Composer { height: 1; border: none; padding: 0 1; background: $boost; }
    Composer:focus { background: $primary 15%; }
    """

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # ctrl+x closes the pane (a workspace key); a one-line composer can live without cut.
        return False if action == "cut" else super().check_action(action, parameters)

    def __init__(self, **kwargs) -> None:
        super().__init__(placeholder="Message · /spawn N task · /burst N · /policy P", compact=True, **kwargs)
