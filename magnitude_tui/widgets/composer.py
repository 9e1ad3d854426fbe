"""Provides the multi-line message composer at the bottom of each pane."""

from __future__ import annotations

import time
from dataclasses import dataclass

from textual import events
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widgets import TextArea

from magnitude_tui.widgets.format import visible, without_ansi

# Terminals send a plain carriage return for shift+enter unless they speak the kitty keyboard
# protocol (tmux and most terminals do not), so ctrl+j, which arrives everywhere as a line feed,
# starts a new line too. (alt+enter is no use: tmux delivers it as esc, then enter.)
NEWLINE_KEYS = ("shift+enter", "ctrl+j")
MAX_ROWS = 8


TYPING_S = 0.3  # a key came this recently: the user is typing


def typing_in(screen) -> bool:
    """Whether a key reached the screen's focused composer within TYPING_S."""
    focused = screen.focused
    return isinstance(focused, Composer) and time.monotonic() - focused.typed_at < TYPING_S


class Composer(TextArea):
    """Where the user types a message or a slash command (/spawn N task, /burst N, /policy P).

    Enter sends; ctrl+j (or shift+enter, where the terminal reports it) starts a new line; up on the first line, in an
    empty composer, recalls the last message for editing (the pane decides what that means);
    ctrl+c copies a selection or, with none, stops the pane's reply.
    The text is taken the moment Enter arrives: keys typed right after it (a fast typist, a
    paste, tmux send-keys) start the next message instead of joining the one being sent.
    """

    DEFAULT_CSS = f"""
    Composer {{ height: auto; max-height: {MAX_ROWS + 1}; min-height: 1; border: none;
                padding: 0 1; background: $boost; }}
    Composer:focus {{ background: $primary 15%; border: none; }}
    Composer .text-area--cursor-line {{ background: transparent; }}
    """

    @dataclass
    class Submitted(Message):
        """Enter was pressed with this text (already taken out of the composer)."""

        composer: "Composer"
        text: str

    @dataclass
    class RecallRequested(Message):
        """Up was pressed in an empty composer: the user wants the last message back to edit."""

        composer: "Composer"

    @dataclass
    class StopRequested(Message):
        """ctrl+c with nothing selected: stop the pane's reply or agent turn, as ctrl+c stops a
        program in a terminal (codex and opencode users reach for it)."""

        composer: "Composer"

    @dataclass
    class KeyShown(Message):
        """The frame after a key is drawn: the moment with the most time to spare before the next
        key, when the workspace paints a pane that waited while keys came."""

        composer: "Composer"

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         compact=True, highlight_cursor_line=False,
                         placeholder="Message · /spawn N task · /burst N · /policy P · /help", **kwargs)
        self.typed_at = -1.0  # when a key last reached this composer (monotonic): the user is typing

    def render_lines(self, crop: Region) -> list[Strip]:
        # A composer whose pane was just closed can still be in the frame being drawn after
        # Textual dropped its component styles (TextArea then raises KeyError): draw nothing.
        if not self.is_attached:
            return [Strip.blank(crop.width) for _ in range(crop.height)]
        return super().render_lines(crop)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # ctrl+x closes the pane, ctrl+y copies the last answer and f6 opens the agent settings
        # (workspace keys): the composer gives up cut, redo and select-line for them.
        if action in ("cut", "redo", "select_line"):
            return False
        return super().check_action(action, parameters)

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(visible(text))
        self.move_cursor(self.document.end)

    # Textual calls `_on_key` / `_on_paste` of every class in the MRO until one prevents the
    # default, so these handle what they take over and otherwise leave TextArea's to run next.
    def _on_key(self, event: events.Key) -> None:  # type: ignore[override]  # Textual awaits either kind
        self.typed_at = time.monotonic()
        self.call_after_refresh(self._key_shown)
        if event.key == "enter":
            self.submit()
        elif event.key in NEWLINE_KEYS:
            self.insert("\n")
        elif event.key == "up" and not self.text:
            self.post_message(self.RecallRequested(self))
        else:
            return
        event.stop()
        event.prevent_default()

    def _on_paste(self, event: events.Paste) -> None:  # type: ignore[override]
        # Handled whole here (and not bubbled): terminals paste line breaks as CR or CRLF, and
        # the message keeps them as newlines.
        event.stop()
        event.prevent_default()
        self.typed_at = time.monotonic()
        # Terminal output pasted with its colours: the escape sequences go, and any other
        # control character shows as its picture (the TextArea would send it to the terminal).
        text = visible(without_ansi(event.text.replace("\r\n", "\n").replace("\r", "\n")))
        self.move_cursor(self.replace(text, *self.selection).end_location)

    def action_copy(self) -> None:
        """ctrl+c: copy the composer's selection, else the screen's (text selected in a reply with
        the mouse); with nothing selected, ask for the pane's reply to stop."""
        if self.selected_text:
            super().action_copy()
        elif self.screen.get_selected_text():
            self.screen.action_copy_text()
        else:
            self.post_message(self.StopRequested(self))

    def _key_shown(self) -> None:
        if self.is_attached:
            self.post_message(self.KeyShown(self))

    def submit(self) -> None:
        """Take the text now and announce it; an empty composer sends nothing. Submitted is posted
        before the clearing's Changed, so a listener sees the send first."""
        text = self.text
        if text.strip():
            self.post_message(self.Submitted(self, text.strip("\n")))
        self.clear()
