"""Provides real OpenAI-compatible servers for the remote-engine tests: llama-cpp-python's own
`llama_cpp.server` (always available where the package is) and the vendored `llama-server`
(where scripts/build_llama_tools.sh has built it), each on the default model."""

from __future__ import annotations

import sys
from pathlib import Path

from magnitude_tui.local_server import ServerProcess, free_port


def llama_cpp_python_server(model: str, *, n_ctx: int = 2048) -> ServerProcess:
    """One request at a time; by default a new request cuts the running stream short, so several
    panes need --interrupt_requests false (then they wait their turn)."""
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", "1", "--model_alias", "smollm2",
           "--verbose", "false", "--interrupt_requests", "false"]
    return ServerProcess(cmd, port, "llama_cpp.server", ready_path="/v1/models")


def llama_server(bindir: Path, model: str, *, parallel: int, n_ctx: int = 4096) -> ServerProcess:
    port = free_port()
    cmd = [str(bindir / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-np", str(parallel), "-c", str(n_ctx), "-t", "1", "-tb", "1", "--no-webui", "--slots"]
    return ServerProcess(cmd, port, "llama-server", ready_path="/v1/models")
