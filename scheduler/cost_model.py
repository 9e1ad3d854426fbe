"""Provides the online step-cost model: a step's time from its decode rows, prompt rows and
attention depth, fitted over a window of measured steps, anchored to a calibrated prior."""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from scheduler.types import AttentionPath, used_cells_kpos

if TYPE_CHECKING:
    from scheduler.budget import StepShape

# target:MS aims below MS by how far recent steps ran over what the cost model predicted for them
# (this percentile of measured / predicted over the model's window): a model that is right on
# average still has half its steps over the target, and a shared machine or a context that deepens
# faster than the fit follows makes the tail longer.
OVERRUN_PERCENTILE = 90
MAX_OVERRUN = 2.0  # never aim below half the target, whatever a burst of noise says

_N = 4  # features of a step: 1, decode rows, prompt rows, attention (thousands of positions)


@dataclass(frozen=True)
class CostParams:
    """step_ms ~= fixed_ms + decode_ms * decode_rows + prefill_ms * prefill_rows + attn_ms * kpos,
    where kpos is the thousands of cached positions the step's rows attend over (see
    `scheduler.types.attended_kpos`): the same 16 prompt rows cost more at position 5,000 than at 0."""

    fixed_ms: float
    decode_ms: float
    prefill_ms: float
    attn_ms: float = 0.0

    def predict(self, decode_rows: int, prefill_rows: int, kpos: float = 0.0) -> float:
        return (self.fixed_ms + self.decode_ms * decode_rows + self.prefill_ms * prefill_rows
                + self.attn_ms * kpos)

    def as_tuple(self) -> tuple[float, float, float, float]:
        return (self.fixed_ms, self.decode_ms, self.prefill_ms, self.attn_ms)


class CostModel:
    """A small online least-squares fit of step time, anchored to a prior.

    The prior comes from calibration (or a simulated profile); every measured step refines it over
    a sliding window. The anchor (ridge toward the prior) grows with the window so the prior always
    counts for about a twentieth of the evidence: recent steps that all look alike (8 decode rows and
    23 prompt rows every time) pin down the cost at that point, while the directions they cannot
    separate stay at the prior instead of drifting on noise. Per-row costs also stay within 10x of
    the prior, so one noisy stretch cannot turn a budget of 20 rows into 2,000. The attention term
    has no useful prior (calibration runs near position 0): it starts at the prior's value and is
    learned from steps deep in a context, bounded by 10x a prompt row's cost per thousand positions.
    """

    # Ridge weights per parameter, per sample: about a twentieth of a typical step's evidence.
    _ANCHOR = (0.05, 3.2, 12.8, 12.8)

    def __init__(self, prior: CostParams | None = None, *, window: int = 128, anchor: float = 1.0,
                 row_cost_range: float | None = 10.0) -> None:
        """`anchor` scales the pull toward the prior and `row_cost_range` bounds per-row costs
        around it; a calibration fit sets them to ~0 and None, since its prior is only a guess
        and the measurements are all there is to go on."""
        self.prior = prior or CostParams(fixed_ms=5.0, decode_ms=1.0, prefill_ms=1.0)
        self.anchor = tuple(anchor * w for w in self._ANCHOR)
        self.row_cost_range = row_cost_range
        self.params = self.prior
        self._samples: deque[tuple[tuple[float, ...], float]] = deque(maxlen=window)
        self._overruns: deque[float] = deque(maxlen=window)  # measured / predicted, before each update
        self._overruns_sorted: list[float] = []  # the same values, kept sorted for `overrun`
        self._xx = [[0.0] * _N for _ in range(_N)]  # running sums over the window: X^T X, X^T y
        self._xy = [0.0] * _N
        self._bounds_of: CostParams | None = None  # the prior `_lo_hi` was worked out for
        self._lo_hi: tuple[list[float], list[float]] = ([], [])

    def seed(self, params: CostParams) -> None:
        """Replace the prior (after calibration) and forget older measurements."""
        self.prior = params
        self.params = params
        self._samples.clear()
        self._overruns.clear()
        self._overruns_sorted.clear()
        self._xx = [[0.0] * _N for _ in range(_N)]
        self._xy = [0.0] * _N

    def observe(self, decode_rows: int, prefill_rows: int, step_ms: float, kpos: float = 0.0) -> None:
        # A step of zero (or negative) time was not measured (a fake backend); it teaches nothing.
        if decode_rows + prefill_rows <= 0 or not math.isfinite(step_ms) or step_ms <= 0:
            return
        predicted = self.predict(decode_rows, prefill_rows, kpos)
        if predicted > 0:
            ratio = step_ms / predicted
            if len(self._overruns) == self._overruns.maxlen:
                ranked = self._overruns_sorted
                del ranked[bisect.bisect_left(ranked, self._overruns[0])]
            self._overruns.append(ratio)
            bisect.insort(self._overruns_sorted, ratio)
        x = (1.0, float(decode_rows), float(prefill_rows), float(kpos))
        if len(self._samples) == self._samples.maxlen:
            self._accumulate(*self._samples[0], sign=-1.0)
        self._samples.append((x, step_ms))
        self._accumulate(x, step_ms, sign=1.0)
        self.params = self._fit()

    def predict(self, decode_rows: int, prefill_rows: int, kpos: float = 0.0) -> float:
        return self.params.predict(decode_rows, prefill_rows, kpos)

    def overrun(self) -> float:
        """How far recent steps ran over their prediction (the OVERRUN_PERCENTILE-th percentile of
        measured / predicted over the window), between 1 and MAX_OVERRUN; 1 before any step."""
        ranked = self._overruns_sorted
        if not ranked:
            return 1.0
        at = ranked[min(len(ranked) - 1, int(len(ranked) * OVERRUN_PERCENTILE / 100))]
        return min(max(at, 1.0), MAX_OVERRUN)

    def rows_within(self, target_ms: float, shape: "StepShape") -> int:
        """The most prompt rows the step `shape` describes can take and still be predicted to
        finish within `target_ms` (0 if none), up to the batch's room. The cost rises with every
        row (a row's own work and, deep in a context, its attention), so a bisection finds it."""
        room = max(0, shape.n_batch - shape.decode_rows)
        cost = self._prompt_cost(shape)
        if room == 0 or cost(1) > target_ms:
            return 0
        lo, hi = 1, room
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost(mid) <= target_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _prompt_cost(self, shape: "StepShape") -> "Callable[[int], float]":
        """`n -> self.predict(shape.decode_rows, n, shape.kpos(n))`, the same arithmetic in the
        same order (so the same bits), with the step's constant part summed once: a bisection
        calls it a dozen times a step."""
        p = self.params
        base = p.fixed_ms + p.decode_ms * shape.decode_rows
        per_row, attn, d = p.prefill_ms, p.attn_ms, shape.decode_rows
        if shape.path is AttentionPath.DENSE:
            cells = shape.cells_used
            return lambda n: base + per_row * n + attn * used_cells_kpos(cells + d + n, d + n)
        kpos0, pos0 = shape.decode_kpos, shape.prefill_pos0
        return lambda n: base + per_row * n + attn * (kpos0 + (n * pos0 + n * (n + 1) / 2) / 1000.0)

    def _bounds(self) -> tuple[list[float], list[float]]:
        """Each parameter's lowest and highest fitted value (they follow from the prior)."""
        if self._bounds_of is not self.prior:
            prior, r = self.prior.as_tuple(), self.row_cost_range
            lo = [0.0, 1e-3, 1e-3, 0.0]
            hi = [math.inf] * _N
            if r is not None:
                lo[1:3] = [max(1e-3, prior[1] / r), max(1e-3, prior[2] / r)]
                hi[1:3] = [prior[1] * r, prior[2] * r]
                hi[3] = max(prior[3], prior[2]) * r
            self._bounds_of, self._lo_hi = self.prior, (lo, hi)
        return self._lo_hi

    def _accumulate(self, x: tuple[float, ...], y: float, sign: float) -> None:
        xy, xx = self._xy, self._xx
        for i in range(_N):
            sx = sign * x[i]  # the products group as written before: (sign * x[i]) * ...
            xy[i] += sx * y
            row = xx[i]
            for j in range(_N):
                row[j] += sx * x[j]

    def _fit(self) -> CostParams:
        # Normal equations (X^T X + L) theta = X^T y + L prior, solved with each parameter kept in
        # its bounds: one that falls outside is pinned there and the rest re-solved, so a pinned
        # intercept does not leave the slopes fitted to an intercept that no longer exists.
        prior = self.prior.as_tuple()
        weight = max(1.0, float(len(self._samples)))
        m = [row[:] for row in self._xx]
        v = self._xy[:]
        for i in range(_N):
            m[i][i] += self.anchor[i] * weight
            v[i] += self.anchor[i] * weight * prior[i]
        lo, hi = self._bounds()
        theta = _solve(m, v)  # nothing pinned yet
        if theta is None:
            return self.params
        if all(lo[i] <= x <= hi[i] for i, x in enumerate(theta)):
            return CostParams(*theta)  # the usual step: every parameter in its bounds
        pinned: dict[int, float] = {}
        for attempt in range(_N):
            free = [i for i in range(_N) if i not in pinned]
            if attempt:
                sub = _solve([[m[i][j] for j in free] for i in free],
                             [v[i] - sum(m[i][k] * x for k, x in pinned.items()) for i in free])
                if sub is None:
                    return self.params
                theta = [pinned.get(i, 0.0) for i in range(_N)]
                for i, x in zip(free, sub):
                    theta[i] = x
            out = {i: min(max(theta[i], lo[i]), hi[i]) for i in free if not lo[i] <= theta[i] <= hi[i]}
            if not out:
                break
            pinned.update(out)
        theta = [min(max(x, lo[i]), hi[i]) for i, x in enumerate(theta)]
        return CostParams(*theta)


def _solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None if singular."""
    n = len(v)
    a = [row + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        # The first row with the largest magnitude, as max() picks it.
        pivot, best = col, abs(a[col][col])
        for r in range(col + 1, n):
            if abs(a[r][col]) > best:
                pivot, best = r, abs(a[r][col])
        if best < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        top = a[col]
        for r in range(col + 1, n):
            row = a[r]
            f = row[col] / top[col]
            row[col:] = [x - f * y for x, y in zip(row[col:], top[col:])]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        row = a[r]
        x[r] = (row[n] - sum([row[c] * x[c] for c in range(r + 1, n)])) / row[r]
    return x
