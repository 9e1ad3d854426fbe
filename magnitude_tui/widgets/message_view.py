"""Provides one message of a transcript: a header line and a Markdown body.

A reply that is still streaming shows its text plainly (StreamingText: appending costs the new
text, not the reply); when it ends the body becomes a Markdown widget, parsed once.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static

from magnitude_tui.store import MessageRecord
from magnitude_tui.widgets.streaming_text import StreamingText


class MessageView(Vertical):
    """A message; an assistant reply that is still streaming grows through `write()`."""

    DEFAULT_CSS = """
    MessageView { height: auto; padding: 0 1 0 0; }
    MessageView > .header { height: 1; color: $text-muted; text-style: bold; }
    MessageView.-user > .header { color: $primary; }
    MessageView.-assistant > .header { color: $accent; }
    MessageView.-result > .header { color: $secondary; }
    MessageView.-note > .header { color: $warning; }
    MessageView > Markdown { margin: 0; padding: 0 0 0 1; background: transparent; }
    MessageView > StreamingText { padding: 0 0 0 1; margin: 0 0 1 0; }
    MessageView.-user > Markdown { border-left: outer $primary 50%; }
    """

    def __init__(self, message: MessageRecord, *, speaker: str, streaming: bool = False) -> None:
        super().__init__(classes=f"-{self.kind_of(message)}")
        self.message = message
        self._speaker = speaker
        self._streaming = streaming  # the body starts empty and receives every fragment via write()
        self._writing = False  # write() has been called and finish() not yet
        self._header = ""

    @staticmethod
    def kind_of(message: MessageRecord) -> str:
        if message.author:
            return "result"
        if message.role == "user":
            return "user"
        return "assistant" if message.role == "assistant" else "note"

    def compose(self) -> ComposeResult:
        self._header = self._header_text()
        yield Static(self._header, classes="header", markup=False)
        if self._streaming:
            yield StreamingText()
        else:
            yield Markdown(self.message.content)

    def _header_text(self) -> str:
        m = self.message
        if m.author:
            return f"↩ {m.author} (subagent answer)"
        state = ""
        if self._writing or (self._streaming and not m.complete):
            state = " …"
        elif m.role == "assistant" and not m.complete:
            state = " · interrupted"
        elif m.done_reason and m.done_reason != "stop":
            state = f" · {m.done_reason}"
        return f"{self._speaker}{state}"

    async def write(self, fragment: str) -> None:
        """Append streamed text (called on the workspace's paint tick, never per token)."""
        if not self._writing:
            self._writing = True
            self.refresh_header()
        self.query_one(StreamingText).append(fragment)

    async def finish(self, note: str | None = None) -> None:
        """The reply ended: its body becomes Markdown (parsed once), with a note (an error) if any."""
        text = self.message.content + (f"\n\n> {note}\n" if note else "")
        for body in self.query(StreamingText):
            await body.remove()
            await self.mount(Markdown(text))
        self._writing = False
        self.refresh_header()

    def refresh_header(self) -> None:
        text = self._header_text()
        if self.is_mounted and text != self._header:
            self._header = text
            self.query_one(".header", Static).update(text)
