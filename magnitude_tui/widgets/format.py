"""Provides the number formatting and text sparklines the widgets share."""

from __future__ import annotations

import re
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


# Control characters drawn as their Unicode pictures: written to the terminal as they are, an
# escape sequence in a reply or a paste is obeyed, not shown (ESC [2J cleared the screen, ESC ]0;…
# BEL retitled the terminal window). Newline and tab stay, carriage returns go; C1 controls (U+0080–U+009F, which some
# terminals read as CSI and friends) become U+FFFD.
_PICTURES = {c: chr(0x2400 + c) for c in range(0x20) if c not in (0x09, 0x0A)}
_PICTURES[0x0D] = ""  # a carriage return (CRLF line ends, a lone CR) is dropped
_PICTURES[0x7F] = "␡"
_PICTURES.update({c: "\ufffd" for c in range(0x80, 0xA0)})
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9b[0-?]*[ -/]*[@-~]")


def visible(text: str) -> str:
    """`text` safe to draw: every control character but newline and tab as its picture (ESC as
    ␛), carriage returns dropped. Applying it twice changes nothing."""
    return text.translate(_PICTURES)


def without_ansi(text: str) -> str:
    """`text` without terminal escape sequences (colours, OSC titles): what pasted terminal output
    carries that is no part of its text."""
    return _ANSI.sub("", text)
