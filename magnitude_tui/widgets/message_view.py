"""Provides one message of a transcript: a header line and a Markdown body that can stream."""

from __future__ import annotations

import asyncio

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static
from textual.widgets._markdown import MarkdownStream

from magnitude_tui.store import MessageRecord


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
    MessageView.-user > Markdown { border-left: outer $primary 50%; }
    """

    def __init__(self, message: MessageRecord, *, speaker: str, streaming: bool = False) -> None:
        super().__init__(classes=f"-{self.kind_of(message)}")
        self.message = message
        self._speaker = speaker
        self._streaming = streaming  # the body starts empty and receives every fragment via write()
        self._stream: MarkdownStream | None = None

    @staticmethod
    def kind_of(message: MessageRecord) -> str:
        if message.author:
            return "result"
        if message.role == "user":
            return "user"
        return "assistant" if message.role == "assistant" else "note"

    def compose(self) -> ComposeResult:
        yield Static(self._header_text(), classes="header", markup=False)
        yield Markdown("" if self._streaming else self.message.content)

    def _header_text(self) -> str:
        m = self.message
        if m.author:
            return f"↩ {m.author} (subagent answer)"
        state = ""
        if self._stream is not None or (self._streaming and not m.complete):
            state = " …"
        elif m.role == "assistant" and not m.complete:
            state = " · interrupted"
        elif m.done_reason and m.done_reason != "stop":
            state = f" · {m.done_reason}"
        return f"{self._speaker}{state}"

    async def write(self, fragment: str) -> None:
        """Append streamed text (called on the pane's flush timer, never per token)."""
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
            self.refresh_header()
        await self._stream.write(fragment)

    async def on_unmount(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            # At app exit Textual may already have cancelled the stream's task; stopping it then
            # raises CancelledError, which must not turn a clean quit into a traceback.
            try:
                await stream.stop()
            except asyncio.CancelledError:
                pass

    async def finish(self, note: str | None = None) -> None:
        """The reply ended: stop streaming, append a note (an error) and settle the header."""
        if self._stream is not None:
            await self._stream.stop()
        if note:
            await self.query_one(Markdown).append(f"\n\n> {note}\n")
        self._stream = None
        self.refresh_header()

    def refresh_header(self) -> None:
        if self.is_mounted:
            self.query_one(".header", Static).update(self._header_text())
