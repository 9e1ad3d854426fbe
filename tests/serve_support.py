"""Runs `serve` for tests (the same helper the bench uses), and watches what its hub does."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from magnitude_tui.serve.thread import RunningServer, free_port, serve_in_thread as running_server
from scheduler.types import StepReport

__all__ = ["CancelWatch", "RunningServer", "free_port", "recording", "running_server", "wait_until",
           "watching_cancels"]


def wait_until(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


@contextmanager
def recording(server: RunningServer):
    """The engine's step reports while the block runs (the hub sees every batch)."""
    reports: list[StepReport] = []
    dispatch = server.hub.dispatch

    def record(batch):
        reports.extend(ev for ev in batch if isinstance(ev, StepReport))
        dispatch(batch)

    server.hub.dispatch = record
    try:
        yield reports
    finally:
        del server.hub.dispatch  # back to the class's method


@dataclass
class CancelWatch:
    reports: list[StepReport]
    cancelled: list[str] = field(default_factory=list)  # the request ids the hub cancelled, in order


@contextmanager
def watching_cancels(server: RunningServer):
    """Step reports and the hub's cancels while the block runs; when it ends without an error, waits
    until no call is live and the engine runs nothing."""
    with recording(server) as reports:
        watch = CancelWatch(reports)
        cancel = server.hub.cancel

        def record(request_id):
            watch.cancelled.append(request_id)
            cancel(request_id)

        server.hub.cancel = record
        try:
            yield watch
            wait_until(lambda: server.hub.num_live == 0)
            wait_until(lambda: reports and reports[-1].running == 0)
        finally:
            del server.hub.cancel
