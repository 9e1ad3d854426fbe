"""Provides the one-line message composer at the bottom of each pane."""

from __future__ import annotations

import time

from textual import events
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
        self.typed_at = -1.0  # when a key last reached this composer (monotonic): the user is typing

    async def _on_key(self, event: events.Key) -> None:
        self.typed_at = time.monotonic()
        await super()._on_key(event)
