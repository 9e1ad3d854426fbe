"""Provides a pane's transcript: the scrolling list of its messages, of which only the latest are
widgets.

Every message on the transcript is a MessageView, and a finished reply is Markdown: a few dozen
widgets for a reply with a list in it. Textual lays out every widget of the screen on each layout,
on screen or not, so a long session made every frame of the app slower: with eight panes of
twenty turns each (4,400 widgets), keys took 0.2 s at the median to reach the screen while the
panes streamed, and a resize took 1.5 s. So the transcript mounts only the latest messages, about
`SHOWN_SCREENS` of its screenfuls of text (counted in characters; at least `MIN_SHOWN` messages),
and a line at its top says how many earlier ones are not shown. Page Up at the top, or a click on
that line, shows another such stretch above. New messages trim the oldest views again, only while
the transcript is scrolled to its end (never under a reader), and only once the text shown is
twice the budget (so a stream of short messages does not mount and unmount on every one). A
transcript that grows (a zoom, a larger terminal) fills its larger budget at once. The messages
themselves are all kept (the store, the context); only their widgets come and go.
"""

from __future__ import annotations

from typing import Callable, Sequence

from textual import events
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from magnitude_tui.records import MessageRecord
from magnitude_tui.widgets.message_view import MessageView

SHOWN_SCREENS = 2  # screenfuls of text (characters per cell of the transcript) kept as widgets
MIN_SHOWN = 2  # messages always shown, however long
MIN_SHOWN_CHARS = 2_000  # the budget of a tiny (or not yet laid out) transcript
UNSIZED_CHARS = 6_000  # the budget before the transcript has a size (compose)
HEADER_CHARS = 80  # what a message's header and margins count for besides its text


def cost(message: MessageRecord) -> int:
    """What a shown message counts for against the budget: its text, its header and margins. A
    tool result shows as its call's folded block (one line), a turn that only called tools as nothing."""
    if message.call is not None:
        return HEADER_CHARS
    if message.calls_only:
        return 0
    return len(message.content) + HEADER_CHARS


def counted(message: MessageRecord) -> bool:
    """Shown as a message of its own (inherited context and calls-only turns are not)."""
    return not message.inherited and not message.calls_only


def shown_from(messages: Sequence[MessageRecord], end: int, budget: int, *, at_least: int = MIN_SHOWN) -> int:
    """Index of the first of the messages before `end` that fit `budget` characters, counted
    back from `end` (inherited context, never shown, counts nothing); at least `at_least` of them."""
    total = count = 0
    i = end
    while i > 0:
        m = messages[i - 1]
        if counted(m):
            c = cost(m)
            if count >= at_least and total + c > budget:
                break
            total += c
            count += 1
        i -= 1
    return i


class Transcript(VerticalScroll):
    """The latest messages of `messages` (the pane's own list, which grows) as MessageViews."""

    def __init__(self, messages: list[MessageRecord], make_view: Callable[[MessageRecord], MessageView],
                 fork_note: str | None = None) -> None:
        super().__init__(classes="transcript", can_focus=False)
        self._messages = messages
        self._make_view = make_view
        self._fork_note = fork_note
        self._earlier = Static("", classes="earlier-note", markup=False)

    def compose(self) -> ComposeResult:
        if self._fork_note:
            yield Static(self._fork_note, classes="fork-note", markup=False)
        yield self._earlier
        start = shown_from(self._messages, len(self._messages), self.budget())
        for m in self._messages[start:]:
            if not m.inherited:
                yield self._make_view(m)

    def on_mount(self) -> None:
        self.anchor()
        self._show_count()

    # ---- what is shown ------------------------------------------------------------------------

    def budget(self) -> int:
        """Characters of messages kept as widgets: SHOWN_SCREENS of the transcript's cells."""
        cells = self.size.width * self.size.height
        return max(MIN_SHOWN_CHARS, SHOWN_SCREENS * cells) if cells else UNSIZED_CHARS

    def views(self) -> list[MessageView]:
        return list(self.query_children(MessageView))

    @property
    def hidden(self) -> int:
        """Messages before the first one shown that are not on screen (inherited ones not counted)."""
        return sum(counted(m) for m in self._messages[:self._first_shown(self.views())])

    def _first_shown(self, views: list[MessageView]) -> int:
        """Index in the messages of the first one shown (their length if none is)."""
        first = views[0].message if views else None
        return next((i for i, m in enumerate(self._messages) if m is first), len(self._messages))

    def _show_count(self) -> None:
        hidden = self.hidden
        self._earlier.display = hidden > 0
        if hidden:
            self._earlier.update(f"▲ {hidden} earlier message{'s' * (hidden != 1)} not shown · "
                                 "page up at the top (or a click here) shows more")

    def _items(self) -> list:
        """What the transcript shows below its own lines: message views and context notes."""
        return [w for w in self.children if w is not self._earlier and not w.has_class("fork-note")]

    def _shown_chars(self) -> int:
        return sum(cost(v.message) for v in self.views())

    def _at_end(self) -> bool:
        # Read before a new view is laid out: an anchored transcript is still at its old end then.
        return self.scroll_y >= self.max_scroll_y - 1

    async def _mount_earlier(self) -> MessageView | None:
        """Mount the stretch of messages before the first one shown, above everything shown
        (context notes included); returns the view that was first, if any, or None if nothing
        was hidden."""
        views = self.views()
        end = self._first_shown(views)
        start = shown_from(self._messages, end, self.budget(), at_least=1)
        new = [self._make_view(m) for m in self._messages[start:end] if not m.inherited]
        if not new:
            return None
        items = self._items()
        await self.mount_all(new, before=items[0] if items else None)
        return views[0] if views else new[-1]

    async def show_earlier(self) -> int:
        """The reader asked for more: mount the stretch before the first message shown, keeping
        the message that was first at the top of the view; returns how many came."""
        before = len(self.views())
        keep = await self._mount_earlier()
        if keep is not None:
            self.call_after_refresh(self.scroll_to_widget, keep, top=True, animate=False)
        self._show_count()
        return len(self.views()) - before

    async def add(self, view: MessageView) -> None:
        """Mount a new message at the end, then trim the oldest views if the reader is at the end."""
        await self.mount(view)
        await self.trim()

    async def add_note(self, text: str) -> None:
        """Mount a context note (what the engine dropped from the context) at the end; `trim`
        removes it with the turns before it."""
        await self.mount(Static(text, classes="context-note", markup=False))

    async def trim(self) -> None:
        """Unmount the oldest views once the text shown is twice the budget, down to the budget,
        while the transcript is scrolled to its end (a reader further up keeps what they read).
        Context notes among them go with them: they told of turns no longer shown."""
        if not self._at_end():
            return
        views = self.views()
        budget = self.budget()
        sizes = [cost(v.message) for v in views]
        total = sum(sizes)
        if total <= 2 * budget:
            return
        cut = 0
        while len(views) - cut > MIN_SHOWN and total - sizes[cut] > budget:
            total -= sizes[cut]
            cut += 1
        if cut:
            items = self._items()
            await self.remove_children(items[:items.index(views[cut])])
            self._show_count()

    async def refill(self) -> None:
        """After messages were taken away (an edit, a retry): show earlier ones until the budget
        is filled again, without moving the reader (one at the end stays at the end)."""
        at_end = self._at_end()
        while self.hidden and (len(self.views()) < MIN_SHOWN or self._shown_chars() < self.budget()):
            if await self._mount_earlier() is None:
                break
        if at_end:
            self.anchor()
        self._show_count()

    async def on_resize(self, event: events.Resize) -> None:
        """Grown (a zoom, a bigger terminal): fill the larger budget from the earlier messages,
        the reader staying where they are. Shrinking unmounts nothing (the next message trims)."""
        if self.hidden and self._shown_chars() < self.budget():
            await self.refill()

    async def on_click(self, event: events.Click) -> None:
        if event.widget is self._earlier:
            event.stop()
            await self.show_earlier()
