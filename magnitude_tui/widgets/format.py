"""Provides the number formatting and text sparklines the widgets share."""

from __future__ import annotations

from typing import Iterable

_BARS = " ▁▂▃▄▅▆▇█"


def fmt_ms(ms: float | None) -> str:
    """Milliseconds for people: '—', '840 ms', '3.2 s'."""
    if ms is None:
        return "—"
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{ms / 1000:.1f} s"


def fmt_rate(tok_s: float | None) -> str:
    return "—" if tok_s is None else f"{tok_s:.1f}"


def fmt_count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


def spark(values: Iterable[float], width: int, *, top: float | None = None) -> str:
    """The last `width` values as block characters, scaled to `top` (default: their maximum)."""
    tail = list(values)[-width:]
    if not tail:
        return " " * width
    top = top if top is not None else max(tail)
    if top <= 0:
        return (_BARS[1] * len(tail)).rjust(width)
    last = len(_BARS) - 1
    chars = (_BARS[max(1 if v > 0 else 0, min(last, round(v / top * last)))] for v in tail)
    return "".join(chars).rjust(width)
