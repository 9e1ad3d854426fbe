"""Runs `serve` for tests (the same helper the bench uses), and watches what its hub does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from magnitude_tui.engine.events import StepReport
from magnitude_tui.serve.thread import RunningServer, free_port
from magnitude_tui.serve.thread import serve_in_thread as running_server

__all__ = ["CancelWatch", "RunningServer", "ServeProcess", "free_port", "recording", "running_server",
           "serve_process", "wait_until", "watching_cancels"]


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


# ---- a real `magnitude-tui serve` process ------------------------------------------------------

@dataclass
class ServeProcess:
    """A `serve` subprocess: its port, its Popen, and its log (stderr) lines as they arrive."""

    port: int
    proc: subprocess.Popen
    lines: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, text: str, timeout: float = 60.0) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None and not any(text in line for line in self.lines):
                time.sleep(0.2)  # the reader may still be draining the pipe
                if not any(text in line for line in self.lines):
                    break
            time.sleep(0.02)
        raise AssertionError(f"no log line with {text!r}; the log:\n{self.log}")


@contextmanager
def serve_process(*args: str, ready: bool = True, env: dict | None = None):
    """Start `python -m magnitude_tui.cli serve --port P ARGS` and yield it (once the engine is
    ready, unless `ready` is False); kill it afterwards if it is still running."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "magnitude_tui.cli", "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    server = ServeProcess(port, proc)

    def read() -> None:
        for line in proc.stderr:
            server.lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if ready:
            server.wait_for_line("[serve] ready", timeout=120)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=10)
