"""Provides the body of a reply while it streams: text that grows at the end, cheaply.

A Markdown widget re-parses its last block and re-lays out or mounts block widgets on every
append; with eight panes streaming that cost the app most of a core. This widget keeps the text
as source lines: lines that are complete (ended by a newline) are wrapped once per width and
kept as strips, and only the unfinished last line is wrapped again on each append. It draws
through the line API (one strip per row), so a repaint costs the rows on screen, not the reply.
The message view moves each finished block into its Markdown widget (see `settled_prefix`) and
keeps only the block still being written here; when the reply ends the Markdown takes it all.

Until then a little of the Markdown is shown line by line: **strong** and `code` spans that are
closed on their line, and the lines of a fenced code block, in the code style.
"""

from __future__ import annotations

import re

from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget


_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")


class StreamingText(Widget):
    """Text appended to at the end, wrapped to the widget's width, with light Markdown styling."""

    COMPONENT_CLASSES = {"streaming--strong", "streaming--code"}
    DEFAULT_CSS = """
    StreamingText { height: auto; }
    StreamingText > .streaming--strong { text-style: bold; }
    StreamingText > .streaming--code { color: $text-accent; background: $boost; }
    """

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._style = Style()
        self._clear(text)
        self._height = 0

    def _clear(self, text: str) -> None:
        self._complete: list[str] = []  # source lines ended by a newline
        self._code: list[bool] = []  # per complete line: a fence or inside a fenced code block
        self._in_fence = False  # the tail is inside a fenced code block
        self._tail = ""  # the unfinished last source line
        self._width = -1  # the width `_wrapped` was made for
        self._wrapped: list[Strip] = []  # strips of _complete[:_wrapped_upto]
        self._wrapped_upto = 0
        self._tail_strips: tuple[str, int, list[Strip]] = ("", -1, [])
        if text:
            self._add(text)

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self._complete) + self._tail

    def append(self, fragment: str) -> None:
        """Add text at the end; lays out again only when the number of rows changes."""
        if not fragment:
            return
        self._add(fragment)
        width = self._width if self._width > 0 else self.size.width
        if width > 0:
            height = self._rows(width)
            if height != self._height:
                self._height = height
                self.refresh(layout=True)
                return
        self.refresh()

    def reset(self, text: str) -> None:
        """Start over with `text` (the finished blocks went to the Markdown above)."""
        self._clear(text)
        self._height = -1
        self.refresh(layout=True)

    def _add(self, fragment: str) -> None:
        parts = (self._tail + fragment).split("\n")
        for line in parts[:-1]:
            fence = line.lstrip().startswith("```")
            self._code.append(fence or self._in_fence)
            self._in_fence ^= fence
            self._complete.append(line)
        self._tail = parts[-1]

    def _styled(self, line: str, code: bool) -> Text:
        line = line.expandtabs(4)
        if code or line.lstrip().startswith("```"):
            return Text(line, style=self.get_component_rich_style("streaming--code"), end="")
        text, pos = Text(end=""), 0
        for match in _INLINE.finditer(line):
            text.append(line[pos:match.start()])
            strong, code_span = match.groups()
            if strong is not None:
                text.append(strong, self.get_component_rich_style("streaming--strong"))
            else:
                text.append(code_span, self.get_component_rich_style("streaming--code"))
            pos = match.end()
        text.append(line[pos:])
        return text

    def _wrap(self, line: str, width: int, code: bool = False) -> list[Strip]:
        console = self.app.console
        text = self._styled(line, code)
        rows = text.wrap(console, width, overflow="fold") if line else [Text("")]
        return [Strip(list(row.render(console, end="")), row.cell_len) for row in rows] or [Strip.blank(0)]

    def _rows(self, width: int) -> int:
        """Bring the rows up to date for `width` (cached rows of complete lines, then the tail's
        rows) and return how many there are."""
        width = max(1, width)
        if width != self._width:
            self._width, self._wrapped, self._wrapped_upto = width, [], 0
        for line, code in zip(self._complete[self._wrapped_upto:], self._code[self._wrapped_upto:]):
            self._wrapped.extend(self._wrap(line, width, code))
        self._wrapped_upto = len(self._complete)
        tail, tail_width, strips = self._tail_strips
        if tail != self._tail or tail_width != width:
            strips = self._wrap(self._tail, width, self._in_fence) if self._tail else []
            self._tail_strips = (self._tail, width, strips)
        return len(self._wrapped) + len(strips)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._height = self._rows(width)
        return self._height

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._width = -1  # the cached rows carry component styles: wrap again (a theme change)

    def render_lines(self, crop: Region) -> list[Strip]:
        self._style = self.rich_style  # one look-up per render, not one per row (it walks the DOM)
        self._rows(self.size.width)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self._style
        wrapped, tail = self._wrapped, self._tail_strips[2]
        if y < len(wrapped):
            strip = wrapped[y]
        elif y - len(wrapped) < len(tail):
            strip = tail[y - len(wrapped)]
        else:
            return Strip.blank(width, style)
        return strip.crop_extend(0, width, style).apply_style(style)
