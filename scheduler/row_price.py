"""Provides RowPrice: what one more draft row adds to a step, from the steps the engine timed.

The cost model's per-row coefficient is fitted over all recent steps; at one sequence they hardly
vary in row count, so that coefficient is poorly identified and swung between 0.1 and 0.5 of a
one-row step in three runs of the same work on the real model, while a verification row really
cost 0.6-0.8 of one. Draft rows are priced instead from decode-only steps of the same width timed
with and without drafts: per drafted step, (its time / the plain step's - 1) / its draft rows, and
the median of those, a share of the plain step (robust to one slow step and to the machine's load,
which moves both alike). Plain steps timed at another depth are brought to a drafted step's depth by
the cost model's ratio of the two.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median
from typing import Callable

__all__ = ["RowPrice"]

# Recent steps kept per width (decode rows): plain ones give the base, drafted ones the price.
PLAIN_WINDOW = 16
DRAFTED_WINDOW = 32
# Evidence needed before the measured price replaces the cost model's.
MIN_PLAIN = 3
MIN_DRAFTED = 4
# How many widths are remembered (the one observed longest ago is forgotten first). A width is
# 48 floats at most; 64 covers every batch width this engine is started with in practice.
MAX_WIDTHS = 64


def _at_depth(plain, kpos: float, predict: Callable[[float], float] | None) -> list[float]:
    """The plain steps' times, each scaled by the model's ratio of a step at `kpos` to one at its own."""
    if predict is None:
        return [ms for ms, _ in plain]
    now = predict(kpos)
    out = []
    for ms, then_kpos in plain:
        then = predict(then_kpos)
        out.append(ms * now / then if now > 0 and then > 0 else ms)
    return out


class RowPrice:
    """Per engine: the measured cost of a draft row as a share of a decode-only step without
    drafts at the same width, or None until enough such steps were timed."""

    def __init__(self) -> None:
        # Per width, least recently observed first: the (ms, kpos) of its plain steps and the
        # per-row shares of its drafted ones.
        self._widths: dict[int, tuple[deque[tuple[float, float]], deque[float]]] = {}
        self.timed = False  # whether any step was timed (a fake backend's never are)

    def observe(self, decode_rows: int, draft_rows: int, prefill_rows: int, step_ms: float,
                kpos: float = 0.0, predict: Callable[[float], float] | None = None) -> None:
        """A successful step: steps with prompt rows, or not timed (a fake backend), teach nothing.
        `kpos`: the attention work of its decode rows (thousands of positions); `predict(kpos)`:
        the cost model's time, now, of a plain step of this width at that work. A drafted step is
        compared with the plain ones brought to its depth by that model's ratio (its level, which
        the online fit moves, cancels): against their raw times, plain steps timed at the end of
        a batch's long replies (deeper, slower) made a drafted step at the start of the next batch
        look nearly free, and `auto` at 8 sequences drafted at forced lookup's 0.6 acceptance."""
        if not math.isfinite(step_ms) or step_ms <= 0:
            return
        self.timed = True
        if prefill_rows or decode_rows <= 0:
            return
        width = self._widths.pop(decode_rows, None)  # re-inserted last: the most recent
        if width is None:
            if len(self._widths) >= MAX_WIDTHS:
                del self._widths[next(iter(self._widths))]
            width = (deque(maxlen=PLAIN_WINDOW), deque(maxlen=DRAFTED_WINDOW))
        self._widths[decode_rows] = width
        plain, drafted = width
        if draft_rows <= 0:
            plain.append((step_ms, kpos))
        elif len(plain) >= MIN_PLAIN:
            base = median(_at_depth(plain, kpos, predict))
            drafted.append((step_ms / base - 1.0) / draft_rows)

    def share(self, decode_rows: int) -> float | None:
        """One more draft row beside `decode_rows` decode rows, as a share of that step without
        drafts; None without enough evidence at that width."""
        width = self._widths.get(decode_rows)
        if width is None or len(width[1]) < MIN_DRAFTED:
            return None
        return max(0.0, median(width[1]))

    def wants_plain(self, decode_rows: int) -> bool:
        """Whether a step at this width should go without drafts so that the price can be
        measured: timed steps, but fewer than MIN_PLAIN plain ones timed at this width. A drafted
        step is priced against the plain ones; a policy that drafted from a width's first step on
        (the cost model's price said rows were cheap) never timed one, and so drafted at that
        price for good."""
        width = self._widths.get(decode_rows)
        return self.timed and (width is None or len(width[0]) < MIN_PLAIN)
