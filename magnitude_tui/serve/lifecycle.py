"""Provides the headless server's lifecycle: a graceful stop on SIGTERM/SIGINT and a supervised engine worker."""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from magnitude_tui.serve.hub import EngineHub, EngineState

# What a stream still running when the grace period ends is told (an `error` event, then [DONE]):
# a client must never take a cut reply for a complete one.
CUT_SHORT = "the server is shutting down; this reply was cut short"


@dataclass(frozen=True)
class Stop:
    """Why the server stops, and the exit status a supervisor (systemd, a container runtime) sees."""

    code: int
    why: str


@dataclass(frozen=True)
class RestartPolicy:
    """How a dead engine worker is restarted: after 1, 2, 4, ... s (at most `max_delay_s`), and at
    most `limit` times within `window_s`; past that the server exits non-zero."""

    limit: int = 5
    window_s: float = 600.0
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0

    def delay(self, recent: int) -> float:
        return min(self.max_delay_s, self.first_delay_s * 2 ** recent)


@dataclass(frozen=True)
class Lifecycle:
    """What the headless server does beyond answering: stop on signals (after `grace_s` for the
    streams in flight) and restart a dead worker (None: leave it dead, /health says so)."""

    grace_s: float = 5.0
    signals: bool = True
    restart: RestartPolicy | None = field(default_factory=RestartPolicy)


class Stopper:
    """Asked to stop once (a signal, or the supervisor giving up); asked again, it hurries: the
    grace period ends at once."""

    def __init__(self) -> None:
        self.stop: Stop | None = None
        self.requested = asyncio.Event()
        self.hurry = asyncio.Event()

    def request(self, stop: Stop) -> None:
        if self.stop is None:
            self.stop = stop
            self.requested.set()
        else:
            self.hurry.set()


def install_signals(stopper: Stopper) -> Callable[[], None]:
    """SIGTERM and SIGINT ask the server to stop (exit 0 once every stream is ended); returns
    what removes the handlers."""
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)
    for sig in sigs:
        loop.add_signal_handler(sig, stopper.request, Stop(0, f"received {sig.name}"))

    def remove() -> None:
        for sig in sigs:
            loop.remove_signal_handler(sig)

    return remove


async def drain(hub: EngineHub, grace_s: float, stopper: Stopper, log: Callable[[str], None]) -> None:
    """Refuse new calls, give the calls in flight `grace_s` to finish, then end the rest with an
    error (their streams send it as an `error` event, then [DONE])."""
    hub.draining = True
    if hub.num_live:
        log(f"stopping: {hub.num_live} requests in flight, up to {grace_s:g} s to finish")
    end = time.monotonic() + grace_s
    while hub.num_live and time.monotonic() < end and not stopper.hurry.is_set():
        await asyncio.sleep(0.05)
    ended = hub.end_all(CUT_SHORT)
    if ended:
        log(f"ended {ended} requests still running after the grace period")


async def supervise(hub: EngineHub, client, policy: RestartPolicy, stopper: Stopper,
                    log: Callable[[str], None]) -> None:
    """Restart the worker when it dies; stop the server (exit 1, with the engine's reason) when the
    model cannot load or the worker dies more than `policy.limit` times within its window."""
    restarts: list[float] = []
    readies = 0  # hub.num_ready when the current worker started: it loaded once the count grew
    while True:
        await hub.state_changed.wait()
        hub.state_changed.clear()
        if hub.state is not EngineState.FAILED or hub.draining:
            continue
        failed = hub.failed
        reason = hub.failure or "unknown"
        if hub.num_ready == readies or (failed is not None and not failed.restartable):
            stopper.request(Stop(1, f"the engine could not start: {reason}"))
            return
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < policy.window_s]
        if len(restarts) >= policy.limit:
            stopper.request(Stop(1, f"the engine stopped {len(restarts) + 1} times within "
                                    f"{policy.window_s:g} s; giving up. Last: {reason}"))
            return
        delay = policy.delay(len(restarts))
        restarts.append(now)
        log(f"{reason} (serve: restarting the engine in {delay:g} s, restart {len(restarts)} of "
            f"{policy.limit} within {policy.window_s:g} s)")
        await asyncio.sleep(delay)
        if stopper.stop is not None:
            return
        readies = hub.num_ready
        await asyncio.get_running_loop().run_in_executor(None, client.restart)
