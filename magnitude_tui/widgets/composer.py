"""Provides the one-line message composer at the bottom of each pane."""

from __future__ import annotations

import time

from textual import events
from textual.widgets import Input


class Composer(Input):
    """Where the user types a message or a slash command (/spawn N task, /burst N, /policy P).

    A one-line Input keeps only the first line of a paste; a pasted document or code block would
    lose the rest without a word. So a paste of several lines is held whole and shows as a
    placeholder (`[pasted text #1: 42 lines, 1,830 chars]`) that `take()` puts back on send.
    """

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
        self._pastes: dict[str, str] = {}  # placeholder -> the pasted text it stands for
        self._pasted = 0

    async def _on_key(self, event: events.Key) -> None:
        self.typed_at = time.monotonic()
        await super()._on_key(event)

    def _on_paste(self, event: events.Paste) -> None:
        event.stop()
        event.prevent_default()  # Input's own handler would insert the first line again
        self.typed_at = time.monotonic()
        text = event.text.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
        if "\n" in text:
            self._pasted += 1
            shown = f"[pasted text #{self._pasted}: {text.count(chr(10)) + 1} lines, {len(text):,} chars]"
            self._pastes[shown] = text
            text = shown
        if not text:
            return
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)

    def take(self) -> str:
        """The message to send: the text with every paste placeholder still in it replaced by what
        was pasted; the composer is left empty."""
        value = self.value
        for shown, text in self._pastes.items():
            value = value.replace(shown, text)
        self._pastes.clear()
        self.clear()
        return value
