"""Provides the one percentile the project reports (linear interpolation, q in 0..100), its median
and the rounding used in tables: the panels, the bench and the reliability scenarios share them."""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def percentile(values: Sequence[float], q: float, *, ordered: bool = False) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values. `ordered`: the values
    are sorted already (a list kept sorted as it grows reads its percentiles in O(1))."""
    if not values:
        return None
    xs = values if ordered else sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Iterable[float]) -> float | None:
    return percentile(list(values), 50)


def rnd(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)
