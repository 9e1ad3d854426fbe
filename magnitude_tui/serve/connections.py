"""Provides the server's connection limits: a header timeout, a connection cap, and a log that cannot be flooded."""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass
from typing import Callable

# Descriptors kept free of HTTP connections: the engine pipe, the log, the database, the listening
# sockets, and whatever a request itself opens.
RESERVED_FDS = 64
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s")
BUSY_BODY = (b'{"error": {"message": "too many open connections; retry shortly", '
             b'"type": "service_unavailable_error", "code": "too_many_connections", "param": null}}')


@dataclass(frozen=True)
class ConnectionLimits:
    """`header_timeout_s`: a connection must send a whole request head this soon after it opens
    (or after its previous response); `max_connections`: open connections beyond it are answered
    503 and closed at once; `keep_alive_s`: an idle keep-alive connection is closed after it."""

    header_timeout_s: float = 10.0
    max_connections: int = 512
    keep_alive_s: float = 5.0


def raise_fd_limit() -> int:
    """Lift this process's open-file limit to its hard limit (as a server should); returns the
    limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(limits: ConnectionLimits) -> int:
    """The configured cap, or fewer when the descriptors left would run out first (an accept that
    fails with EMFILE makes the whole server unreachable)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(1, min(limits.max_connections, soft - RESERVED_FDS))


def guarded_protocol(limits: ConnectionLimits):
    """uvicorn's HTTP/1.1 protocol class with the header timeout and the connection cap."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    cap = connection_cap(limits)

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > cap:
                transport.write(BUSY % (len(BUSY_BODY), BUSY_BODY))
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            # Between requests (keep-alive), a new head must also arrive in time.
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()
            super().data_received(data)

        def connection_lost(self, exc) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._expire, self.cycle)

        def _expire(self, cycle_then) -> None:
            self._header_timer = None
            if self.cycle is cycle_then and not self.transport.is_closing():  # no new request began
                self.transport.close()

    return GuardedH11Protocol


class QuietLog:
    """At most `burst` lines per `window_s` from one source; the rest are counted and reported in
    one line when the window ends. A client that provokes a line per request (or a loop error per
    failed accept) cannot fill the disk."""

    def __init__(self, write: Callable[[str], None], *, burst: int = 20, window_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write, self.burst, self.window_s, self.clock = write, burst, window_s, clock
        self._start = clock()
        self._count = 0
        self._suppressed = 0

    def __call__(self, line: str) -> None:
        now = self.clock()
        if now - self._start >= self.window_s:
            if self._suppressed:
                self.write(f"{self._suppressed} more lines like these were not written")
            self._start, self._count, self._suppressed = now, 0, 0
        self._count += 1
        if self._count <= self.burst:
            self.write(line)
        else:
            self._suppressed += 1


def quiet_loop_errors(loop: asyncio.AbstractEventLoop, log: Callable[[str], None]) -> None:
    """The loop's unhandled errors (an accept that fails for want of descriptors, a transport
    error) as one rate-limited line each, without a traceback."""
    quiet = QuietLog(log, burst=5, window_s=10.0)

    def handler(_loop, context: dict) -> None:
        exc = context.get("exception")
        quiet(f"{context.get('message', 'event loop error')}" + (f": {exc!r}" if exc else ""))

    loop.set_exception_handler(handler)
