"""Provides the workspace's paint tick: when each pane's buffered text and status reach the screen.

Each Textual frame lays out the whole screen and redraws the bounding box of everything that
changed: a frame in which panes all over the grid changed costs about a full redraw, so panes
painted together share one frame (one `batch_update`). Panes are painted on a tick:

- the focused pane on every tick; the others too while at most BUSY_PANES panes stream, else
  every BACKGROUND_PAINT_S, all in one frame;
- while keys come (within TYPING_S of one) no pane's text is painted, the focused one's neither,
  for at most TYPING_MAX_HOLD_S: a new row of text lays out the whole screen, and the frame that
  shows the typed key should draw little more than the composer. When the hold is used up and keys
  still come, the panes are painted one per key, right after the frame that showed it (the moment
  with a typing interval to spare before the next key), the least recently painted first, until
  each had its turn (then the hold starts again): a key waits neither for a frame that lays out
  and draws all eight nor, at a typing pace, for one pane's;
- a pane whose reply ended is painted at once (its ending posts ReplyFinished, which subagents
  wait for), and a pane hidden by zoom only then.
"""

from __future__ import annotations

import time

from magnitude_tui.widgets.composer import TYPING_S  # after a key no pane paints this long

PAINT_TICK_S = 0.1  # the focused pane's text and status repaint this often (tokens are buffered)
BACKGROUND_PAINT_S = 0.25  # the other panes', while more than BUSY_PANES panes stream at once
BUSY_PANES = 2
TYPING_MAX_HOLD_S = 1.0  # ... but the panes still repaint (one per key) at least this often


class Painter:
    """Decides, on each tick, which panes flush their buffered text (see the module doc)."""

    def __init__(self, workspace) -> None:
        self.workspace = workspace
        self.painted_all = 0.0  # when every pane was last painted, or had its turn (monotonic)
        self.painted_at: dict[str, float] = {}  # session id -> when its text was last painted

    async def paint(self) -> None:
        ws = self.workspace
        panes = self._panes()
        now = time.monotonic()
        focused = ws.grid.focused_pane()
        typed_at = focused.composer.typed_at if focused is not None else -1.0
        if now - typed_at < TYPING_S:
            chosen = []  # keys come: the panes that waited get their turns right after a key's frame
        else:
            everyone = sum(p.busy for p in panes) <= BUSY_PANES or now - self.painted_all >= BACKGROUND_PAINT_S
            if everyone:
                self.painted_all = now
            chosen = [p for p in panes if (everyone or p is focused) and p.display]
        await self._flush(panes, chosen, now)

    async def after_key(self) -> None:
        """The frame showing a key is drawn: the next key is a typing interval away, the best moment
        for one pane's frame (the least recently painted, once the hold is used up)."""
        panes, now = self._panes(), time.monotonic()
        chosen = self._turn(panes, now)
        if chosen:
            await self._flush(panes, chosen, now)

    def _panes(self) -> list:
        return [p for p in self.workspace.panes_by_session().values() if p.is_mounted]

    async def _flush(self, panes: list, chosen: list, now: float) -> None:
        with self.workspace.app.batch_update():
            for pane in panes:
                if not pane.is_mounted:  # closed while an earlier pane was being painted
                    continue
                if pane.has_ended or pane in chosen:
                    self.painted_at[pane.session_id] = now
                    await pane.flush()

    def _turn(self, panes: list, now: float) -> list:
        """While keys come: nobody during the hold, then one pane per key, the least recently
        painted first, until none is older than the hold."""
        if now - self.painted_all < TYPING_MAX_HOLD_S:
            return []
        waiting = [p for p in panes if p.display and self.painted_at.get(p.session_id, 0.0) <= now - TYPING_MAX_HOLD_S]
        if not waiting:  # every pane had its turn: hold again
            self.painted_all = now
            return []
        return [min(waiting, key=lambda p: self.painted_at.get(p.session_id, 0.0))]
