"""Provides a local server process for peers and tests (llama-server, llama-cpp-python's server):
started on a free loopback port, ready when a URL answers 200, stopped (terminate, then kill) on
exit, its output kept in a log file that error messages name."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

__all__ = ["ServerProcess", "ServerStartError", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(RuntimeError):
    """The process exited, or did not answer in time; the message ends with its log's tail."""


class ServerProcess:
    """`cmd` serving on 127.0.0.1:`port`; `with` starts it and waits for `ready_path` to answer."""

    def __init__(self, cmd: list[str], port: int, name: str, *, ready_path: str = "/health",
                 ready_timeout_s: float = 180.0) -> None:
        self.cmd, self.port, self.name = cmd, port, name
        self.url = f"http://127.0.0.1:{port}"
        self.ready_path, self.ready_timeout_s = ready_path, ready_timeout_s
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"{self.name} exited with {self.proc.returncode}; log {self.log.name}:\n"
                                       f"{self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__(None, None, None)
        raise ServerStartError(f"{self.name} did not answer within {self.ready_timeout_s:.0f} s; "
                               f"log {self.log.name}:\n{self.log_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")
