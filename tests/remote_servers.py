"""Provides real OpenAI-compatible servers for the remote-engine tests: llama-cpp-python's own
`llama_cpp.server` (always available where the package is) and the vendored `llama-server`
(where scripts/build_llama_tools.sh has built it), each on the default model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server process on 127.0.0.1, ready when its /v1/models answers; killed on exit."""

    def __init__(self, cmd: list[str], port: int, name: str) -> None:
        self.cmd, self.port, self.name = cmd, port, name
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix=f"{name}-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"{self.name} did not answer within 180 s: {self.log_text()[-2000:]}")

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


def llama_cpp_python_server(model: str, *, n_ctx: int = 2048) -> ServerProcess:
    """One request at a time; by default a new request cuts the running stream short, so several
    panes need --interrupt_requests false (then they wait their turn)."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "1", "--model_alias", "smollm2",
           "--verbose", "false", "--interrupt_requests", "false"]
    return ServerProcess(cmd, port, "llama_cpp.server")


def llama_server(bindir: Path, model: str, *, parallel: int, n_ctx: int = 4096) -> ServerProcess:
    port = free_port()
    cmd = [str(bindir / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-np", str(parallel), "-c", str(n_ctx), "-t", "1", "-tb", "1", "--no-webui", "--slots"]
    return ServerProcess(cmd, port, "llama-server")
