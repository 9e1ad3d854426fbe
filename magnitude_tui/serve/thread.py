"""Provides serve_in_thread: the server on a free loopback port in a thread of its own (tests, bench)."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.local_server import free_port
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.connections import ConnectionLimits
from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.serve.server import serve_async


@dataclass
class RunningServer:
    url: str
    log: io.StringIO
    hub: EngineHub

    @property
    def base(self) -> str:
        return self.url + "/v1"


@contextmanager
def serve_in_thread(config: EngineConfig, options: ServeOptions = ServeOptions(), *, in_process: bool = True,
                    ready_timeout: float = 300.0, limits: ConnectionLimits = ConnectionLimits()):
    """Start the engine (a worker thread, or a worker process with in_process=False) and the HTTP
    app; yield a RunningServer once the engine is ready; stop both after."""
    port = free_port()
    log = io.StringIO()
    client = WorkerClient(config, in_process=in_process, log_path=None if in_process else "auto")
    client.start()
    hub = EngineHub(client)
    started = threading.Event()
    holder: dict = {}

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(serve_async(client, host="127.0.0.1", port=port, options=options,
                                               out=log, started=ready, hub=hub, limits=limits))
        holder["loop"], holder["task"] = asyncio.get_running_loop(), task
        await ready.wait()
        started.set()
        try:
            await task
        except asyncio.CancelledError:
            pass

    # asyncio.run, not a bare loop: at the end it cancels and awaits the tasks the server left
    # behind (sse-starlette's shutdown watcher polls until the process exits), then closes the loop.
    # A loop dropped with them pending logs "Task was destroyed but it is pending!".
    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    if not started.wait(ready_timeout):
        raise RuntimeError(f"serve did not become ready: {log.getvalue()}")
    _wait_listening(port)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", log, hub)
    finally:
        holder["loop"].call_soon_threadsafe(holder["task"].cancel)
        thread.join(timeout=30)


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port}")
