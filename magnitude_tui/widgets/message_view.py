"""Provides one message of a transcript: a header line and a Markdown body.

A reply that is still streaming is Markdown up to its last finished block (a paragraph ended by a
blank line, a closed code fence): each run of finished blocks is mounted as a Markdown widget of
its own when it completes, so a block is parsed once, not on every paint; the block still being
written is drawn by StreamingText (appending costs the new text, not the reply). When the reply
ends, the pieces are replaced by the whole body parsed as one Markdown document.
"""

from __future__ import annotations

import asyncio

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Markdown, Static

from magnitude_tui.records import MessageRecord
from magnitude_tui.widgets.format import visible
from magnitude_tui.widgets.streaming_text import StreamingText

# A reply longer than this is drawn as StreamingText from there on (light Markdown styling), never
# as Markdown widgets: each finished block mounted as Markdown, and the whole parsed again when it
# ends, cost layout work that grows with the reply. With one pane receiving 100,000 tokens beside
# seven streaming ones (`bench soak --only ui-endurance`), keys took seconds to reach the screen
# and the finished reply froze the app while it was parsed.
LONG_REPLY_CHARS = 16_000
# A streaming reply keeps only its latest finished blocks as Markdown widgets: about as many
# characters as its transcript shows at once (cells of the viewport), at least MIN_MARKDOWN_CHARS
# and at most MAX_MARKDOWN_CHARS; older finished blocks are folded into one StreamingText above
# them. Every Markdown block is a few widgets, and each frame that lays out (a new row, a new
# block) walks every widget on the screen: with eight replies streaming for long, their per-block
# widgets made each layout cost hundreds of milliseconds and grew the app's memory. The folded
# text keeps the light styling, and is parsed as Markdown with the rest when the reply ends.
MIN_MARKDOWN_CHARS = 600
MAX_MARKDOWN_CHARS = 6_000


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
    MessageView > StreamingText.folded { margin: 0; }
    MessageView.-user > Markdown { border-left: outer $primary 50%; }
    MessageView > .plain { padding: 0 0 1 1; border-left: outer $primary 50%; }
    """

    def __init__(self, message: MessageRecord, *, speaker: str, streaming: bool = False) -> None:
        super().__init__(classes=f"-{self.kind_of(message)}")
        self.message = message
        self._speaker = speaker
        self._streaming = streaming  # the body starts empty and receives every fragment via write()
        self._writing = False  # write() has been called and finish() not yet
        self._finished = False  # finish() began: the body is the whole message, written once
        self._settled = not streaming  # the body is one Markdown document, on screen (finish() done)
        self._body_lock = asyncio.Lock()
        self._header = ""
        self._streamed = 0  # characters written so far
        self._deferred = False  # the open text may hold finished blocks (a write did not settle)
        self._long = len(message.content) > LONG_REPLY_CHARS  # drawn as StreamingText only

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
        if self._streaming:  # the Markdown comes with the first finished block (see write)
            yield StreamingText()
        elif self._long:
            yield StreamingText(visible(self.message.content))
        elif self.kind_of(self.message) == "user" and "\n" in self.message.content.strip():
            # What the user wrote over several lines (a pasted block: code, a log) is shown as
            # written; as Markdown its line breaks and indentation would collapse into one paragraph.
            yield Static(visible(self.message.content.strip("\n")), classes="plain", markup=False)
        else:
            yield body_markdown(self.message.content)

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
        pages = f" ‹{m.shown + 1}/{len(m.others) + 1}› alt+←/→" if m.others else ""
        return visible(f"{self._speaker}{state}{pages}")

    async def redraw(self) -> None:
        """The message's text was swapped for another answer: draw the new one whole."""
        async with self._body_lock:
            self.refresh_header()
            if not self._settled or not self.is_attached:
                return  # still streaming: the reply's end draws it
            await self.remove_children("Markdown, StreamingText, .plain")
            text = visible(self.message.content)
            self._long = len(text) > LONG_REPLY_CHARS
            await self.mount(StreamingText(text) if self._long else body_markdown(text))

    async def write(self, fragment: str, *, settle: bool = True) -> None:
        """Append streamed text (called on the workspace's paint tick, never per token). With
        `settle` False, finished blocks stay in the open text until a write that settles."""
        async with self._body_lock:  # a paint and the reply's end may overlap at their awaits
            if self._finished:
                return  # finish() took the whole message already
            if not self._writing:
                self._writing = True
                self.refresh_header()
            tails = self.query(StreamingText)
            if not self.is_attached or not tails:
                # A paint as the app closes can mount this view onto a transcript being torn down
                # (Textual then skips the mount): there is nothing to draw on, and the text itself
                # is in self.message already.
                return
            tail = tails.last()  # the open block (a folded head, if any, is the first)
            fragment = visible(fragment)
            self._streamed += len(fragment)
            if self._streamed > LONG_REPLY_CHARS:
                self._long = True
            if self._long:
                tail.append(fragment)
                return
            if not settle:
                tail.append(fragment)
                self._deferred = True
                return
            # A block can only end at a newline, and the tail holds none that ended one (unless
            # an earlier write deferred settling).
            pending = tail.text + fragment if "\n" in fragment or self._deferred else ""
            self._deferred = False
            cut = settled_prefix(pending)
            if cut:
                tail.reset(pending[cut:])
                await self._add_finished(pending[:cut], before=tail)
            else:
                tail.append(fragment)

    async def _add_finished(self, finished: str, *, before: StreamingText) -> None:
        """Finished blocks become a Markdown widget of their own, parsed once; what would take the
        Markdown pieces past the budget (`markdown_budget`) goes to the folded head, oldest first."""
        budget = self.markdown_budget()
        pieces = list(self.query_children(Markdown))
        # The latest blocks of `finished` that fit the budget stay Markdown; a block longer than
        # the budget on its own is folded at once.
        keep_from = next((end for end in [0, *block_ends(finished)]
                          if len(finished) - end <= budget), len(finished))
        if keep_from:
            fold = pieces  # the head stays ahead of every piece, in reading order
        else:
            sizes = [len(piece.source) for piece in pieces]
            total, n_fold = sum(sizes) + len(finished), 0
            while n_fold < len(pieces) and total > budget:
                total -= sizes[n_fold]
                n_fold += 1
            fold = pieces[:n_fold]
        if fold or keep_from:
            heads = self.query_children(".folded")
            if heads:
                head = heads.first(StreamingText)
            else:
                head = StreamingText(classes="folded")
                await self.mount(head, before=pieces[0] if pieces else before)
            head.append("".join(piece.source for piece in fold) + finished[:keep_from])
            if fold:
                await self.remove_children(fold)
        if keep_from < len(finished):
            await self.mount(body_markdown(finished[keep_from:]), before=before)

    def markdown_budget(self) -> int:
        """Characters of finished blocks this reply keeps as Markdown widgets while it streams."""
        viewport = self.parent.size if isinstance(self.parent, Widget) else None
        shown = viewport.width * viewport.height if viewport else 0
        return max(MIN_MARKDOWN_CHARS, min(MAX_MARKDOWN_CHARS, shown))

    async def finish(self, note: str | None = None) -> None:
        """The reply ended: its body becomes Markdown (parsed once), with a note (an error) if any."""
        async with self._body_lock:
            if self._finished:
                return
            self._finished = True
            text = visible(self.message.content) + (f"\n\n> {note}\n" if note else "")
            if self._long and self.is_attached:  # too long to parse as one document: keep it drawn
                tails = self.query(StreamingText)
                if note and tails:
                    tails.last().append(f"\n\n> {note}\n")
            elif self._streaming and self.is_attached:  # the streamed pieces give way to one document
                pieces = list(self.query("StreamingText, Markdown"))
                # Mount the whole first, then drop the pieces: no frame shows the body missing.
                await self.mount(body_markdown(text), before=pieces[0] if pieces else None)
                await self.remove_children(pieces)
            self._writing = False
            self._settled = True
            self.refresh_header()

    @property
    def settled(self) -> bool:
        """The body is final: one Markdown document of the whole message, nothing still streaming."""
        return self._settled

    def set_speaker(self, speaker: str) -> None:
        """Who said it is named otherwise now (a pane was renamed)."""
        self._speaker = speaker
        self.refresh_header()

    def refresh_header(self) -> None:
        text = self._header_text()
        # Mounted is not enough: while the app closes (or before compose) the header may be gone.
        headers = self.query(".header") if self.is_mounted else None
        if headers and text != self._header:
            self._header = text
            headers.first(Static).update(text)


def line_break_parser() -> MarkdownIt:
    """Textual's parser ("gfm-like") with every line break kept: a model writes a poem or a list
    without bullets one item a line, which CommonMark would join into one paragraph. (The
    `breaks` option only changes markdown-it's HTML; Textual reads the tokens, so the soft breaks
    become hard ones there.)"""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("keep_line_breaks", _keep_line_breaks)
    return parser


def _keep_line_breaks(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def body_markdown(text: str) -> Markdown:
    """A message body as Markdown, its single line breaks kept (control characters shown, not
    sent to the terminal)."""
    return Markdown(visible(text), parser_factory=line_break_parser)


def block_ends(text: str) -> list[int]:
    """Where finished top-level blocks of `text` end, in order: after each blank line outside a
    code fence, and after each line that closes a fence. `text` starts outside a fence (everything
    before it was settled the same way)."""
    ends, pos, fenced = [], 0, False
    for line in text.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith("\n"):
            break  # the unfinished last line
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if not fenced:
                ends.append(pos)
        elif not fenced and not line.strip():
            ends.append(pos)
    return ends


def settled_prefix(text: str) -> int:
    """Length of the part of `text` that ends with a finished top-level block (0 if none yet)."""
    ends = block_ends(text)
    return ends[-1] if ends else 0
