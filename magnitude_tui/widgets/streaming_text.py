"""Provides the body of a reply while it streams: text that grows at the end, cheaply.

A Markdown widget re-parses its last block and re-lays out or mounts block widgets on every
append; with eight panes streaming that cost the app most of a core. This widget keeps the text
as source lines and draws through the line API (one strip per row), so a repaint costs the rows on
screen, not the reply. For each width it keeps only how many rows each complete line (ended by a
newline) wraps to, counted once; the strips of a line are made when a row of it is drawn, and only
the most recently drawn lines' strips are kept (`STRIP_CACHE_LINES`). So what it holds beyond its
text is a few bytes per line per recent width, however long the reply grows (a reply of 100,000
tokens kept every row's strips before, with their caches: tens of MiB), and only the unfinished
last line is wrapped again on each append.

Counting is lazy where there is much to count: at a new width (a resize), or when many lines
arrive at once, only the lines that fill the last screenful are wrapped at once; the others get an
estimate from their length (`_estimate`) and are counted exactly on later ticks, a few
milliseconds' worth at a time, the lines nearest the end first (`_refine`). The exact counts
replace the estimates in one go when all are in (one layout, not one per tick; a text still
growing puts them in with its next append, whose layout they share), and lines about to
be drawn while still estimated are counted first (`render_lines`). So a resize of a reply of
500,000 characters wraps a screenful, not the reply (it used to wrap every line in the resize's
frame), and once the counting is done the rows are exactly those of a full count.

The message view moves each finished block into a Markdown widget (see `settled_prefix`) and keeps
only the block still being written here; when the reply ends the Markdown takes it all.
Until then a little of the Markdown is shown line by line: **strong** and `code` spans that are
closed on their line, and the lines of a fenced code block, in the code style.
"""

from __future__ import annotations

import re
import time
from array import array
from bisect import bisect_right
from collections import OrderedDict
from itertools import accumulate, islice

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
# A catch-up of more lines than this (a resize, a large append) counts exactly only the lines that
# fill the last EXACT_TAIL_ROWS rows (at least a screenful); the rest is estimated, then refined.
LAZY_LINES = 200
EXACT_TAIL_ROWS = 120
REFINE_TICK_S = 0.04  # estimated lines are counted exactly on a timer this often ...
REFINE_BUDGET_S = 0.006  # ... for at most this long a tick
# Exact counts move rows, which takes a layout; a text still growing lays out on its next append
# anyway, so they wait for it (this long at most); one that no longer grows lays out at once.
PUBLISH_WAIT_S = 1.0


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


def _estimate(line: str, width: int) -> int:
    """A guess at `wrapped_rows(line, width)` from the line's length alone (no wrapping)."""
    return max(1, -(-len(line) // width))


class _Rows:
    """The rows of the complete lines at one width.

    `counts` holds each line's row count, exact or (where `estimated` is 1) a guess; `ends` is the
    cumulative row count that drawing uses, rebuilt from `counts` when exact counts replace guesses
    (`publish`) and extended as lines are appended."""

    __slots__ = ("counts", "ends", "estimated", "pending", "changed", "refined", "cursor", "ready")

    def __init__(self) -> None:
        self.counts = array("I")
        self.ends = array("I")
        self.estimated = bytearray()  # per line: 1 while its count is a guess
        self.pending = 0  # lines whose count is a guess
        self.changed = False  # an exact count differed from its guess since the last publish
        self.refined: dict[int, int] = {}  # exact counts of estimated lines, not applied yet
        self.cursor = 0  # refining goes on below this line
        self.ready = False  # `refined` holds every estimated line, waiting to go in

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def extend(self, counts: list[int], guessed: int) -> None:
        """Append the counts of the next lines, the first `guessed` of them guesses."""
        self.counts.extend(counts)
        if guessed and not self.pending:
            self.cursor = len(self.counts) - len(counts) + guessed  # refine from the last guess down
        self.estimated.extend(b"\x01" * guessed + b"\x00" * (len(counts) - guessed))
        self.pending += guessed
        self.ends.extend(islice(accumulate(counts, initial=self.total), 1, None))

    def settle(self, index: int, rows: int) -> None:
        """Line `index` wraps to `rows` rows (its exact count)."""
        if self.counts[index] != rows:
            self.counts[index] = rows
            self.changed = True
        self.estimated[index] = 0
        self.pending -= 1

    def apply_refined(self) -> None:
        """Put the refined counts in (those not counted meanwhile to be drawn)."""
        for line, count in self.refined.items():
            if self.estimated[line]:
                self.settle(line, count)
        self.refined.clear()
        self.cursor = len(self.estimated)  # lines estimated since go in the next pass
        self.ready = False

    def publish(self) -> bool:
        """Draw with the counts now known; returns whether any row moved."""
        changed, self.changed = self.changed, False
        if changed:
            self.ends = array("I", accumulate(self.counts))
        return changed


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
        # width -> the rows of the complete lines at that width, most recent last
        self._by_width: OrderedDict[int, _Rows] = OrderedDict()
        self._refining = False  # a refine tick is scheduled
        self._appended_at = -PUBLISH_WAIT_S  # monotonic time of the last append
        self._strips: OrderedDict[tuple[int, int], list[Strip]] = OrderedDict()  # (line, width)
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
        self._appended_at = time.monotonic()
        rows = self._by_width.get(self._width)
        if rows is not None and rows.ready:
            self._finish_refine(rows, layout=False)  # this append lays out if the rows changed
        width = self._width if self._width > 0 else self.size.width
        self.refresh(layout=width > 0 and self._rows_changed(width))

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

    def _line_rows(self, width: int) -> _Rows:
        """The row counts of the complete lines at `width`, brought up to date: a few new lines are
        counted at once; of many (a new width, a large append) only those that fill the last
        EXACT_TAIL_ROWS rows, the rest estimated and refined on later ticks."""
        rows = self._by_width.get(width)
        if rows is None:
            rows = self._by_width[width] = _Rows()
            if len(self._by_width) > ROW_COUNT_WIDTHS:
                self._by_width.popitem(last=False)
        else:
            self._by_width.move_to_end(width)
        start, stop = len(rows.counts), len(self._complete)
        if start == stop:
            return rows
        lines, code = self._complete, self._code
        if stop - start <= LAZY_LINES:
            rows.extend([wrapped_rows(lines[i], width, code[i]) for i in range(start, stop)], 0)
            return rows
        tail: list[int] = []  # exact counts of the last lines, last first
        shown, i = 0, stop
        while i > start and shown < max(EXACT_TAIL_ROWS, self._viewport_rows()):
            i -= 1
            tail.append(wrapped_rows(lines[i], width, code[i]))
            shown += tail[-1]
        rows.extend([_estimate(lines[j], width) for j in range(start, i)] + tail[::-1], i - start)
        if rows.pending:
            self._schedule_refine()
        return rows

    def _viewport_rows(self) -> int:
        return self.screen.size.height if self.is_attached else 0

    def _schedule_refine(self) -> None:
        if not self._refining and self.is_attached:
            self._refining = True
            self.set_timer(REFINE_TICK_S, self._refine)

    def _refine(self) -> None:
        """Count estimated lines exactly at the current width (nearest the end first) for about
        REFINE_BUDGET_S; when none is left, draw with the exact counts."""
        self._refining = False
        rows = self._by_width.get(self._width)
        if rows is None or rows.ready:
            return
        if not rows.pending:
            rows.refined.clear()  # all were counted to be drawn meanwhile
            return
        deadline = time.perf_counter() + REFINE_BUDGET_S
        # Counted into `rows.refined`, not into the counts that drawing uses: they go in together
        # (a line drawn with some lines above it counted and others not would be misplaced).
        index, counted = rows.cursor, 0
        while True:
            index = rows.estimated.rfind(1, 0, index)
            if index < 0:
                break
            if index not in rows.refined:
                rows.refined[index] = wrapped_rows(self._complete[index], self._width, self._code[index])
            counted += 1
            if counted % 32 == 0 and time.perf_counter() > deadline:
                break
        if index >= 0:
            rows.cursor = index
            self._schedule_refine()
        elif time.monotonic() - self._appended_at < PUBLISH_WAIT_S:  # every line is counted
            rows.ready = True  # the next append puts them in (or this timer)
            self.set_timer(PUBLISH_WAIT_S, lambda: self._finish_refine(rows) if rows.ready else None)
        else:
            self._finish_refine(rows)

    def _finish_refine(self, rows: _Rows, *, layout: bool = True) -> None:
        rows.apply_refined()
        if rows.pending:
            self._schedule_refine()
        if layout:
            self._publish(rows)
        else:
            rows.publish()

    def _publish(self, rows: _Rows) -> None:
        if rows.publish():
            self.refresh(layout=self._rows_changed(self._width))

    def _rows_changed(self, width: int) -> bool:
        """Bring the rows up to date at `width`; whether their number changed (a layout is due)."""
        height = self._rows(width)
        changed, self._height = height != self._height, height
        return changed

    def _exact_between(self, rows: _Rows, top: int, bottom: int) -> bool:
        """Count exactly the estimated lines drawn on rows top..bottom (rows.ends as published);
        returns whether any row moved."""
        first = bisect_right(rows.ends, top)
        last = min(len(rows.estimated), bisect_right(rows.ends, bottom) + 1)
        index = rows.estimated.find(1, first, last)
        if index < 0:
            return False
        while 0 <= index < last:
            rows.settle(index, wrapped_rows(self._complete[index], self._width, self._code[index]))
            index = rows.estimated.find(1, index + 1, last)
        return rows.publish()

    def _rows(self, width: int) -> int:
        """Bring the row counts up to date for `width` (and wrap the tail) and return the rows."""
        width = max(1, width)
        self._width = width
        total = self._line_rows(width).total
        tail, tail_width, strips = self._tail_strips
        if tail != self._tail or tail_width != width:
            strips = self._wrap(self._tail, width, self._in_fence) if self._tail else []
            self._tail_strips = (self._tail, width, strips)
        return total + len(strips)

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
        rows = self._by_width[self._width]
        # Lines about to be drawn whose counts are still guesses are counted first (a scroll into
        # text that a resize has not counted yet); the rows below them may move: lay out again.
        moved = False
        for _ in range(4):  # their exact rows move what is drawn; settles within a pass or two
            if not rows.pending or not self._exact_between(rows, crop.y, crop.bottom):
                break
            moved = True
        if moved and self._rows_changed(self._width):
            self.call_after_refresh(self.refresh, layout=True)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self._style
        ends = self._line_rows(max(1, width)).ends
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
