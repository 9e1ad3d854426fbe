"""Provides Endpoint and EndpointPool: per-server slots, health, and what the panel shows of them."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import AbstractSet

from magnitude_tui.engine.events import EndpointStatus
from scheduler.stats import percentile

RATE_WINDOW_S = 5.0  # tok/s of a server: tokens received over this window
TTFT_SAMPLES = 200


class Endpoint:
    """One server: at most `limit` requests stream from it at once; the rest wait here, FIFO."""

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.limit = limit
        self.healthy = True
        self.in_flight = 0
        self.errors = 0
        self.last_error: str | None = None
        self.models: list[str] = []
        self._waiters: deque[asyncio.Future] = deque()
        self._ttfts: deque[float] = deque(maxlen=TTFT_SAMPLES)
        self._tokens: deque[tuple[float, int]] = deque()  # (monotonic time, tokens received)

    @property
    def queued(self) -> int:
        return sum(not w.done() for w in self._waiters)

    @property
    def load(self) -> float:
        return (self.in_flight + self.queued) / self.limit

    async def acquire(self) -> None:
        """Take a slot, waiting (FIFO) while all `limit` are in use."""
        if self.in_flight < self.limit and not self.queued:
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # release() hands its slot over: in_flight already counts us
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as we were cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_flight -= 1

    def mark_dead(self, why: str) -> None:
        self.healthy = False
        self.error(why)

    def error(self, why: str) -> None:
        self.errors += 1
        self.last_error = why

    def on_first_token(self, ttft_ms: float) -> None:
        self._ttfts.append(ttft_ms)

    def on_tokens(self, n: int) -> None:
        self._tokens.append((time.monotonic(), n))

    def tok_s(self) -> float:
        horizon = time.monotonic() - RATE_WINDOW_S
        while self._tokens and self._tokens[0][0] < horizon:
            self._tokens.popleft()
        return sum(n for _, n in self._tokens) / RATE_WINDOW_S

    def status(self) -> EndpointStatus:
        return EndpointStatus(url=self.url, healthy=self.healthy, in_flight=self.in_flight,
                              queued=self.queued, limit=self.limit, tok_s=self.tok_s(),
                              ttft_p50_ms=percentile(self._ttfts, 50),
                              ttft_p95_ms=percentile(self._ttfts, 95),
                              errors=self.errors, last_error=self.last_error)


class NoEndpoint(RuntimeError):
    """Every server is marked dead."""


class EndpointPool:
    """The servers of one remote engine; new requests go to the least-loaded healthy one."""

    def __init__(self, urls: tuple[str, ...], limit: int) -> None:
        self.endpoints = [Endpoint(u, limit) for u in urls]

    def pick(self, avoid: AbstractSet[str] = frozenset(), prefer: str | None = None) -> Endpoint:
        """`prefer` while it is healthy (a conversation's next turn goes where its prefix is
        cached), else the healthy server with the lowest load (in flight + queued, per slot);
        ties go to the first listed. `avoid`: servers that already failed this request."""
        healthy = [e for e in self.endpoints if e.healthy and e.url not in avoid]
        if not healthy:
            why = "; ".join(f"{e.url}: {e.last_error or 'not answering'}" for e in self.endpoints)
            raise NoEndpoint(f"no server is reachable ({why}); check that they run, then restart (ctrl+r)")
        for e in healthy:
            if e.url == prefer:
                return e
        return min(healthy, key=lambda e: e.load)

    def statuses(self) -> tuple[EndpointStatus, ...]:
        return tuple(e.status() for e in self.endpoints)
