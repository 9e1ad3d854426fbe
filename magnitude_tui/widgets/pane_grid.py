"""Provides the pane grid: auto-tiles 1 to 16 chat panes and zooms one of them."""

from __future__ import annotations

import math

from textual.containers import Container
from textual.dom import DOMNode
from textual.reactive import reactive

from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.workspace.limits import MAX_PANES, MAX_SUBAGENTS  # noqa: F401  (re-exported)


def tiling(n: int) -> tuple[int, int]:
    """Columns and rows for n panes: as square as the count allows, columns first."""
    n = max(1, n)
    columns = math.ceil(math.sqrt(n))
    return columns, math.ceil(n / columns)


class PaneGrid(Container):
    """Holds the chat panes in order; the focused pane is the one with keyboard focus inside it."""

    DEFAULT_CSS = """
    PaneGrid { layout: grid; grid-gutter: 0; }
    PaneGrid.-zoomed > ChatPane { display: none; }
    PaneGrid.-zoomed > ChatPane.-zoom-target { display: block; }
    """

    zoomed: reactive[str | None] = reactive(None)

    @property
    def panes(self) -> list[ChatPane]:
        return list(self.query_children(ChatPane))

    @property
    def is_full(self) -> bool:
        return len(self.panes) >= MAX_PANES

    def pane(self, session_id: str) -> ChatPane | None:
        for pane in self.panes:
            if pane.session_id == session_id:
                return pane
        return None

    def focused_pane(self) -> ChatPane | None:
        node: DOMNode | None = self.screen.focused if self.is_attached else None
        while node is not None:
            if isinstance(node, ChatPane):
                return node
            node = node.parent
        panes = self.panes
        return panes[0] if panes else None

    async def add_pane(self, pane: ChatPane, *, focus: bool = True) -> None:
        await self.mount(pane)
        self._retile()
        if focus:
            self.focus_pane(pane)

    async def remove_pane(self, pane: ChatPane) -> None:
        panes = self.panes
        index = panes.index(pane)
        if self.zoomed == pane.session_id:
            self.zoomed = None
        await pane.remove()
        self._retile()
        rest = self.panes
        if rest:
            self.focus_pane(rest[min(index, len(rest) - 1)])

    def focus_pane(self, pane: ChatPane) -> None:
        if self.zoomed is not None:
            self.zoomed = pane.session_id
        pane.focus_composer()

    def cycle(self, step: int) -> None:
        panes = self.panes
        if not panes:
            return
        current = self.focused_pane()
        index = panes.index(current) if current in panes else 0
        self.focus_pane(panes[(index + step) % len(panes)])

    def toggle_zoom(self) -> None:
        pane = self.focused_pane()
        self.zoomed = None if self.zoomed is not None or pane is None else pane.session_id
        if pane is not None:
            pane.focus_composer()

    def watch_zoomed(self, zoomed: str | None) -> None:
        self.set_class(zoomed is not None, "-zoomed")
        for pane in self.panes:
            pane.set_class(pane.session_id == zoomed, "-zoom-target")
        self._retile()

    def _retile(self) -> None:
        columns, rows = (1, 1) if self.zoomed is not None else tiling(len(self.panes))
        self.styles.grid_size_columns = columns
        self.styles.grid_size_rows = rows
