"""Provides blocking waits on an EngineClient's event stream, for callers with no event loop of
their own (benchmarks, soak scenarios, tests): until a condition holds, until the engine is ready."""

from __future__ import annotations

import time
from typing import Callable

from magnitude_tui.engine.events import EngineFailed, EngineReady
from magnitude_tui.engine.protocol import EngineClient, EngineEvent


class NoEventInTime(TimeoutError):
    """What was awaited did not arrive in time; `seen` holds every event that did."""

    def __init__(self, what: str, timeout_s: float, seen: list[EngineEvent]) -> None:
        last = ", ".join(type(e).__name__ for e in seen[-5:]) or "no events at all"
        super().__init__(f"{what} did not come within {timeout_s:g} s (last events: {last})")
        self.seen = seen


class EngineStartFailed(RuntimeError):
    """The engine reported EngineFailed while it was awaited; the message is the engine's reason."""


def events_until(client: EngineClient, until: Callable[[list[EngineEvent]], bool], timeout_s: float, *,
                 what: str = "the awaited event", poll_s: float = 0.5) -> list[EngineEvent]:
    """Every event from now until `until(events so far)` holds; NoEventInTime after `timeout_s`.
    `poll_s` only bounds how late the deadline is noticed: a batch is returned as soon as it comes."""
    seen: list[EngineEvent] = []
    deadline = time.monotonic() + timeout_s
    while not until(seen):
        left = deadline - time.monotonic()
        if left <= 0:
            raise NoEventInTime(what, timeout_s, seen)
        seen += client.poll_events(timeout=min(poll_s, left)) or []
    return seen


def wait_ready(client: EngineClient, timeout_s: float, *, seen: list[EngineEvent] | None = None,
               poll_s: float = 0.5) -> EngineReady:
    """The engine's EngineReady; EngineStartFailed with its reason if it failed instead,
    NoEventInTime if neither came. Every event read on the way is appended to `seen` when given
    (load progress, requests reported `loading`)."""
    try:
        events = events_until(client, lambda evs: any(isinstance(e, (EngineReady, EngineFailed)) for e in evs),
                              timeout_s, what="EngineReady", poll_s=poll_s)
    except NoEventInTime as e:
        if seen is not None:
            seen += e.seen
        raise
    if seen is not None:
        seen += events
    answer = next(e for e in events if isinstance(e, (EngineReady, EngineFailed)))
    if isinstance(answer, EngineFailed):
        raise EngineStartFailed(answer.message)
    return answer
