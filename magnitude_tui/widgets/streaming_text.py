"""Provides the body of a reply while it streams: text that grows at the end, cheaply.

A Markdown widget re-parses its last block and re-lays out or mounts block widgets on every
append; with eight panes streaming that cost the app most of a core. This widget keeps the text
as source lines and draws through the line API (one strip per row), so a repaint costs the rows on
screen, not the reply. For each width it keeps only how many rows each complete line (ended by a
newline) wraps to, counted once; the strips of a line are made when a row of it is drawn, and only
the most recently drawn lines' strips are kept (`STRIP_CACHE_LINES`). So what it holds beyond its
text is one integer per line per recent width, however long the reply grows (a reply of 100,000
tokens kept every row's strips before, with their caches: tens of MiB), and only the unfinished
last line is wrapped again on each append.

The message view moves each finished block into a Markdown widget (see `settled_prefix`) and keeps
only the block still being written here; when the reply ends the Markdown takes it all.
Until then a little of the Markdown is shown line by line: **strong** and `code` spans that are
closed on their line, and the lines of a fenced code block, in the code style.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import OrderedDict

from rich._wrap import divide_line
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

_INLINE = re.compile(r"\*\*(.+?)\*\*|`([^`]+)`")
STRIP_CACHE_LINES = 256  # source lines whose strips are kept (a screen shows far fewer)
ROW_COUNT_WIDTHS = 4  # widths whose per-line row counts are kept (a resize back costs nothing)
TAB_SIZE = 4


def _plain(line: str, code: bool) -> str:
    """What `_styled` draws of `line`, without its styles (the markers of closed spans removed)."""
    line = line.expandtabs(TAB_SIZE)
    if code or line.lstrip().startswith("```"):
        return line
    return _INLINE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), line)


def wrapped_rows(line: str, width: int, code: bool = False) -> int:
    """How many rows `line` takes when wrapped to `width` as `StreamingText` draws it."""
    plain = _plain(line, code)
    return len(divide_line(plain, width, fold=True)) + 1 if plain else 1


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
        self._width = -1  # the width last laid out for
        # width -> the row just past each complete line (cumulative counts), most recent last
        self._ends: OrderedDict[int, list[int]] = OrderedDict()
        self._strips: OrderedDict[tuple[int, int], list[Strip]] = OrderedDict()  # (line, width)
        self._tail_strips: tuple[str, int, list[Strip]] = ("", -1, [])
        if text:
            self._add(text)

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self._complete) + self._tail

    @property
    def cached_lines(self) -> int:
        """Source lines whose strips are held now (at most STRIP_CACHE_LINES)."""
        return len(self._strips)

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
        line = line.expandtabs(TAB_SIZE)
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

    def _line_ends(self, width: int) -> list[int]:
        """The cumulative row counts of the complete lines at `width`, brought up to date."""
        ends = self._ends.get(width)
        if ends is None:
            ends = self._ends[width] = []
            if len(self._ends) > ROW_COUNT_WIDTHS:
                self._ends.popitem(last=False)
        else:
            self._ends.move_to_end(width)
        total = ends[-1] if ends else 0
        for line, code in zip(self._complete[len(ends):], self._code[len(ends):]):
            total += wrapped_rows(line, width, code)
            ends.append(total)
        return ends

    def _rows(self, width: int) -> int:
        """Bring the row counts up to date for `width` (and wrap the tail) and return the rows."""
        width = max(1, width)
        self._width = width
        ends = self._line_ends(width)
        tail, tail_width, strips = self._tail_strips
        if tail != self._tail or tail_width != width:
            strips = self._wrap(self._tail, width, self._in_fence) if self._tail else []
            self._tail_strips = (self._tail, width, strips)
        return (ends[-1] if ends else 0) + len(strips)

    def _line_strips(self, index: int, width: int) -> list[Strip]:
        key = (index, width)
        strips = self._strips.get(key)
        if strips is None:
            strips = self._strips[key] = self._wrap(self._complete[index], width, self._code[index])
            if len(self._strips) > STRIP_CACHE_LINES:
                self._strips.popitem(last=False)
        else:
            self._strips.move_to_end(key)
        return strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        self._height = self._rows(width)
        return self._height

    def notify_style_update(self) -> None:
        super().notify_style_update()
        # The cached strips carry component styles (a theme change); row counts do not.
        self._strips.clear()
        self._tail_strips = ("", -1, [])

    def render_lines(self, crop: Region) -> list[Strip]:
        self._style = self.rich_style  # one look-up per render, not one per row (it walks the DOM)
        self._rows(self.size.width)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self._style
        ends = self._line_ends(max(1, width))
        complete_rows = ends[-1] if ends else 0
        tail = self._tail_strips[2]
        strip: Strip | None = None
        if y < complete_rows:
            index = bisect_right(ends, y)
            row = y - (ends[index - 1] if index else 0)
            strips = self._line_strips(index, max(1, width))
            strip = strips[row] if row < len(strips) else None
        elif y - complete_rows < len(tail):
            strip = tail[y - complete_rows]
        if strip is None:
            return Strip.blank(width, style)
        return strip.crop_extend(0, width, style).apply_style(style)
