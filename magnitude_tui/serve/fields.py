"""Provides what both completion routes read alike from a body (penalties, sampling, stream, n,
stop, priority, user, model), and the checks of one value their parsers share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

from magnitude_tui.serve.errors import invalid
from scheduler.types import Priority, SamplingParams

MAX_N = 8  # choices per request, each a fork of one evaluated prompt
MAX_STOP = 8
MAX_STOP_CHARS = 256
# Defaults when a body leaves them out: llama-server's sampling defaults.
DEFAULT_TEMPERATURE = 0.8


@dataclass(frozen=True, kw_only=True)
class CallFields:
    """What a chat or a text completions call asks for alike (ChatCall and TextCall add their own)."""

    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    stop: tuple[str, ...] = ()
    priority: int | None = None
    user: str | None = None
    model: str | None = None

    @property
    def priority_class(self) -> Priority:
        """API requests are agents; one asking for a priority above 0 (lower, as in vLLM) runs
        in the background. No API request can claim the interactive class of a person's turn."""
        return Priority.BACKGROUND if (self.priority or 0) > 0 else Priority.AGENT


_Call = TypeVar("_Call", bound=CallFields)


def refuse_penalties(body: dict) -> None:
    """400 for a penalty other than 0: it would change what a reply means, and is not implemented."""
    for name in ("frequency_penalty", "presence_penalty"):
        if number(body, name, lo=-2.0, hi=2.0) not in (None, 0.0):
            raise invalid(name, f"'{name}' other than 0 is not supported by this server", "unsupported_parameter")


def parse_call(body: dict, call: type[_Call], *, max_tokens: int, **own: Any) -> _Call:
    """A `call` of the shared fields, checked in this order (the first wrong one is the 400):
    temperature, top_k, top_p, min_p, seed, ignore_eos, stream, stream_options, user, model, n, stop,
    priority; `max_tokens` and the route's `own` fields are the route's to check first."""
    temperature = number(body, "temperature", lo=0.0, hi=2.0)
    sampling = SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_k=default(integer(body, "top_k", lo=0), 40),
        top_p=default(number(body, "top_p", lo=0.0, hi=1.0, open_lo=True), 0.95),
        min_p=default(number(body, "min_p", lo=0.0, hi=1.0), 0.05),
        seed=integer(body, "seed"),
        max_tokens=max_tokens,
        ignore_eos=boolean(body, "ignore_eos"),
    )
    stream = boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "'stream_options' must be an object")
    include_usage = boolean(options, "include_usage", prefix="stream_options.") if options else False
    if options and not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    for name in ("user", "model"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise invalid(name, f"'{name}' must be a string")
    return call(sampling=sampling, stream=stream, include_usage=include_usage,
                n=default(integer(body, "n", lo=1, hi=MAX_N), 1), stop=stops(body.get("stop")),
                priority=integer(body, "priority"), user=body.get("user") or None, model=body.get("model"), **own)


def default(value, fallback):
    return fallback if value is None else value


def stops(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(isinstance(s, str) for s in items):
        raise invalid("stop", f"'stop' must be a string or an array of at most {MAX_STOP} strings")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise invalid("stop", f"each 'stop' string must hold 1 to {MAX_STOP_CHARS} characters")
    return tuple(items)


def boolean(body: dict, name: str, *, prefix: str = "") -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise invalid(prefix + name, f"'{prefix}{name}' must be true or false")
    return v


def integer(body: dict, name: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(name, f"'{name}' must be an integer (got {type(v).__name__})")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise invalid(name, f"'{name}' must be {_range(lo, hi)} (got {v})")
    return v


def number(body: dict, name: str, *, lo: float, hi: float, open_lo: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid(name, f"'{name}' must be a finite number")
    if v < lo or v > hi or (open_lo and v == lo):
        bound = f"greater than {lo:g}" if open_lo else f"at least {lo:g}"
        raise invalid(name, f"'{name}' must be {bound} and at most {hi:g} (got {v})")
    return float(v)


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f"at least {lo}" if lo is not None else f"at most {hi}"
