"""Provides run_serve: the headless `magnitude-tui serve` (one engine, the HTTP app, a log line per request)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from typing import TextIO

from magnitude_tui.serve.app import Outcome, ServeOptions, create_app
from magnitude_tui.serve.completion import Completion
from magnitude_tui.serve.errors import OpenAIError
from magnitude_tui.serve.hub import EngineHub

API_KEY_ENV = "MAGNITUDE_API_KEY"


class ServeConfigError(ValueError):
    """The server cannot start as asked; the message says what to change."""


def check_bind(host: str, api_key: str | None) -> None:
    """Only loopback may be served without a key: anything else is reachable by other machines."""
    if api_key:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ServeConfigError(
            f"refusing to serve on {host} without an API key: other machines could use this engine. "
            f"Pass --api-key KEY or set {API_KEY_ENV}, or bind 127.0.0.1")


def refusal_line(caller: str, error: OpenAIError) -> str:
    """One line per call answered with an error before it ran (401, 400, 413, 429, 503)."""
    return f"{caller}  refused {error.status} {error.code}: {error.message}"


def log_line(completion: Completion, outcome: Outcome) -> str:
    """One line per finished call: who, outcome, prompt (cached), tokens, queue, TTFT, tok/s, and
    the time spent in each phase (where a slow call lost its time: queued, prefill, generating)."""
    t = completion.timings() if completion.choices else {}
    u = completion.usage() if completion.choices else {}
    cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    parts = [f"{completion.id[:20]}", completion.client_name, outcome.value]
    if u:
        parts.append(f"prompt {u['prompt_tokens']} ({cached} cached)")
        parts.append(f"{u['completion_tokens']} tokens")
    for key, label in (("queue_ms", "queue"), ("ttft_ms", "TTFT")):
        if t.get(key) is not None:
            parts.append(f"{label} {t[key]:.0f} ms")
    if t.get("predicted_per_second"):
        parts.append(f"{t['predicted_per_second']:.1f} tok/s")
    phases = t.get("phases_ms") or {}
    if phases:
        parts.append("phases " + ", ".join(f"{name} {ms:.0f} ms" for name, ms in phases.items()))
    finishes = {c.finish_reason or "error" for c in completion.choices}
    if finishes:
        parts.append("finish " + ",".join(sorted(finishes)))
    return "  ".join(parts)


async def serve_async(client, *, host: str, port: int, options: ServeOptions, out: TextIO = sys.stderr,
                      started: asyncio.Event | None = None, hub: EngineHub | None = None) -> None:
    """Run the engine client, the hub and uvicorn until cancelled (or the server stops)."""
    import uvicorn

    hub = hub or EngineHub(client)
    api = create_app(hub, options,
                     on_finish=lambda c, o: print(f"[serve] {log_line(c, o)}", file=out, flush=True),
                     on_refused=lambda who, e: print(f"[serve] {refusal_line(who, e)}", file=out, flush=True))
    config = uvicorn.Config(api, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    pump = asyncio.create_task(hub.run())
    print(f"[serve] http://{host}:{port}/v1 (model {options.model_name}); loading the engine...",
          file=out, flush=True)
    watch = asyncio.create_task(_announce_ready(hub, out, started))
    try:
        await server.serve()
    finally:
        # Cancelled (serve_in_thread's stop), uvicorn skips its shutdown: close the listening sockets.
        for listening in getattr(server, "servers", ()):
            listening.close()
        watch.cancel()
        client.stop()
        pump.cancel()


async def _announce_ready(hub: EngineHub, out: TextIO, started: asyncio.Event | None) -> None:
    from magnitude_tui.serve.hub import EngineState

    while hub.state is EngineState.LOADING:
        await asyncio.sleep(0.05)
    if hub.state is EngineState.READY:
        r = hub.ready
        print(f"[serve] ready: {r.model} on {r.device}, n_ctx={r.n_ctx}, {r.n_seq_max} sequences, "
              f"policy {r.policy}", file=out, flush=True)
        if r.info.get("template_notice"):  # no chat template: say so where the operator looks
            print(f"[serve] {r.info['template_notice']}", file=out, flush=True)
    else:
        print(f"[serve] the engine failed: {hub.failure}", file=out, flush=True)
    if started is not None:
        started.set()


def served_model_name(client) -> str:
    """The name /v1/models lists: the model file's name, or the default model's."""
    import os

    model = client.target.model
    return os.path.basename(model) if model else "SmolLM2-135M-Instruct"


def resolve_api_key(flag: str | None) -> str | None:
    return flag or os.environ.get(API_KEY_ENV) or None


class _QuietServer:
    """uvicorn inside another program's event loop: the host program keeps its own signals."""

    @staticmethod
    def make(api, host: str, port: int):
        import contextlib

        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        return Server(uvicorn.Config(api, host=host, port=port, log_level="warning", lifespan="off"))


class EmbeddedServer:
    """The endpoint of `magnitude-tui --serve PORT`: shares the TUI's engine client; the workspace
    hands it every engine batch and it opens a pane for every HTTP conversation."""

    def __init__(self, client, *, host: str, port: int, options: ServeOptions) -> None:
        self.hub = EngineHub(client)
        self.api = create_app(self.hub, options)
        self.host, self.port = host, port
        self.task: asyncio.Task | None = None
        self.panes = None

    def start(self, workspace) -> None:
        from magnitude_tui.serve.panes import ApiPanes

        self.panes = ApiPanes(self.hub, workspace)
        server = _QuietServer.make(self.api, self.host, self.port)
        self.task = asyncio.ensure_future(server.serve())
        self.task.add_done_callback(lambda t: self._stopped(t, workspace))

    def _stopped(self, task: asyncio.Task, workspace) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None or not task.result():
            why = f": {error}" if error else " (is the port in use?)"
            workspace.notify(f"the HTTP endpoint on {self.host}:{self.port} stopped{why}",
                             severity="error", timeout=15)

    def dispatch(self, batch: list) -> None:
        self.hub.dispatch(batch)
        if self.panes is not None:
            self.panes.show_unpaned(batch)
