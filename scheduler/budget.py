"""Provides the budget policies (prefill-first, fixed:N, target:MS) and the online step-cost model."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# When the decode rows alone already exceed the target, prompts still get this many rows per step,
# so a newcomer always has a path to its first token (about one decode step's worth of prompt rows
# on the machines in DESIGN.md sections 1 and 6).
MIN_PREFILL_QUANTUM = 16


@dataclass(frozen=True)
class CostParams:
    """step_ms ~= fixed_ms + decode_ms * decode_rows + prefill_ms * prefill_rows."""

    fixed_ms: float
    decode_ms: float
    prefill_ms: float

    def predict(self, decode_rows: int, prefill_rows: int) -> float:
        return self.fixed_ms + self.decode_ms * decode_rows + self.prefill_ms * prefill_rows


class CostModel:
    """A small online least-squares fit of step time, anchored to a prior.

    The prior comes from calibration (or a simulated profile); every measured step refines it over
    a sliding window. The anchor (ridge toward the prior) grows with the window so the prior always
    counts for about a twentieth of the evidence: recent steps that all look alike (8 decode rows and
    23 prompt rows every time) pin down the cost at that point, while the directions they cannot
    separate stay at the prior instead of drifting on noise. Per-row costs also stay within 10x of
    the prior, so one noisy stretch cannot turn a budget of 20 rows into 2,000.
    """

    # Ridge weights per parameter, per sample: about a twentieth of a typical step's evidence.
    _ANCHOR = (0.05, 3.2, 12.8)

    def __init__(self, prior: CostParams | None = None, *, window: int = 128, anchor: float = 1.0,
                 row_cost_range: float | None = 10.0) -> None:
        """`anchor` scales the pull toward the prior and `row_cost_range` bounds per-row costs
        around it; a calibration fit sets them to ~0 and None, since its prior is only a guess
        and the measurements are all there is to go on."""
        self.prior = prior or CostParams(fixed_ms=5.0, decode_ms=1.0, prefill_ms=1.0)
        self.anchor = tuple(anchor * w for w in self._ANCHOR)
        self.row_cost_range = row_cost_range
        self.params = self.prior
        self._samples: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._xx = [[0.0] * 3 for _ in range(3)]  # running sums over the window: X^T X, X^T y
        self._xy = [0.0] * 3

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    def seed(self, params: CostParams) -> None:
        """Replace the prior (after calibration) and forget older measurements."""
        self.prior = params
        self.params = params
        self._samples.clear()
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3

    def observe(self, decode_rows: int, prefill_rows: int, step_ms: float) -> None:
        # A step of zero (or negative) time was not measured (a fake backend); it teaches nothing.
        if decode_rows + prefill_rows <= 0 or not math.isfinite(step_ms) or step_ms <= 0:
            return
        if len(self._samples) == self._samples.maxlen:
            self._accumulate(*self._samples[0], sign=-1.0)
        self._samples.append((decode_rows, prefill_rows, step_ms))
        self._accumulate(decode_rows, prefill_rows, step_ms, sign=1.0)
        self.params = self._fit()

    def predict(self, decode_rows: int, prefill_rows: int) -> float:
        return self.params.predict(decode_rows, prefill_rows)

    def prefill_rows_within(self, target_ms: float, decode_rows: int) -> int:
        """How many prompt rows fit beside `decode_rows` decode rows in `target_ms` (>= 0)."""
        p = self.params
        room = target_ms - p.fixed_ms - p.decode_ms * decode_rows
        if room <= 0:
            return 0
        return int(room / p.prefill_ms)

    def _accumulate(self, d: int, p: int, y: float, sign: float) -> None:
        x = (1.0, float(d), float(p))
        for i in range(3):
            self._xy[i] += sign * x[i] * y
            for j in range(3):
                self._xx[i][j] += sign * x[i] * x[j]

    def _fit(self) -> CostParams:
        # Normal equations (X^T X + L) theta = X^T y + L prior, solved with each parameter kept in
        # its bounds: one that falls outside is pinned there and the rest re-solved, so a pinned
        # intercept does not leave the slopes fitted to an intercept that no longer exists.
        prior = (self.prior.fixed_ms, self.prior.decode_ms, self.prior.prefill_ms)
        weight = max(1.0, float(len(self._samples)))
        m = [row[:] for row in self._xx]
        v = self._xy[:]
        for i in range(3):
            m[i][i] += self.anchor[i] * weight
            v[i] += self.anchor[i] * weight * prior[i]
        r = self.row_cost_range
        lo = [0.0, 1e-3, 1e-3]
        hi = [math.inf, math.inf, math.inf]
        if r is not None:
            lo[1:] = [max(1e-3, prior[1] / r), max(1e-3, prior[2] / r)]
            hi[1:] = [prior[1] * r, prior[2] * r]
        theta: list[float] = [0.0, 0.0, 0.0]
        pinned: dict[int, float] = {}
        for _ in range(3):
            free = [i for i in range(3) if i not in pinned]
            sub = _solve([[m[i][j] for j in free] for i in free],
                         [v[i] - sum(m[i][k] * x for k, x in pinned.items()) for i in free])
            if sub is None:
                return self.params
            theta = [pinned.get(i, 0.0) for i in range(3)]
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
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


@dataclass(frozen=True)
class Policy:
    """How many prompt rows a step may hold beside its decode rows.

    - `prefill-first`: the common default. While any prompt rows are pending, a step holds only
      prompt rows (first come, first served, up to n_batch) and every generating sequence waits.
    - `fixed:N`: N prompt rows per step beside the decode rows (the chunk size).
    - `target:MS`: as many prompt rows as the cost model says fit in MS milliseconds beside the
      decode rows, and at least MIN_PREFILL_QUANTUM.
    """

    kind: str  # "prefill-first" | "fixed" | "target"
    value: float = 0.0

    def __str__(self) -> str:
        if self.kind == "prefill-first":
            return "prefill-first"
        if self.kind == "fixed":
            return f"fixed:{int(self.value)}"
        return f"target:{self.value:g}"

    @property
    def is_prefill_first(self) -> bool:
        return self.kind == "prefill-first"

    def prefill_allowance(self, decode_rows: int, n_batch: int, cost: CostModel) -> int:
        room = max(0, n_batch - decode_rows)
        if self.kind == "prefill-first":
            return n_batch
        if self.kind == "fixed":
            return min(int(self.value), room)
        rows = max(MIN_PREFILL_QUANTUM, cost.prefill_rows_within(self.value, decode_rows))
        return min(rows, room)


def parse_policy(text: str) -> Policy:
    """Parse "prefill-first", "fixed:N" or "target:MS"; ValueError says what is accepted."""
    s = text.strip().lower()
    if s == "prefill-first":
        return Policy("prefill-first")
    kind, sep, arg = s.partition(":")
    try:
        if sep and kind == "fixed":
            n = int(arg)
            if n >= 1:
                return Policy("fixed", float(n))
        elif sep and kind == "target":
            ms = float(arg)
            if ms > 0 and math.isfinite(ms):
                return Policy("target", ms)
    except ValueError:
        pass
    raise ValueError(
        f"unknown scheduling policy {text!r}: use 'prefill-first', 'fixed:N' (N prompt rows per "
        "step, N >= 1) or 'target:MS' (target step time in milliseconds, e.g. target:50)"
    )


def share_rows(order: list[T], pending: list[int], allowance: int, quantum: int) -> list[tuple[T, int]]:
    """Deal `allowance` rows to `order` in turns of at most `quantum` each, never more than an
    item's `pending`; returns (item, rows) for those that got any, in `order`."""
    grant = [0] * len(order)
    left = allowance
    while left > 0:
        gave = 0
        for i, p in enumerate(pending):
            n = min(quantum, p - grant[i], left)
            if n > 0:
                grant[i] += n
                left -= n
                gave += n
        if gave == 0:
            break
    return [(item, g) for item, g in zip(order, grant) if g > 0]
