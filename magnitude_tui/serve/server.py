"""Provides run_serve: the headless `magnitude-tui serve` (one engine, the HTTP app, a log line per request)."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from dataclasses import replace
from typing import Callable, TextIO

from magnitude_tui.serve.app import Outcome, ServeOptions, create_app
from magnitude_tui.serve.completion import Completion
from magnitude_tui.serve.connections import ConnectionLimits, QuietLog, guarded_protocol, quiet_loop_errors
from magnitude_tui.serve.errors import OpenAIError
from magnitude_tui.serve.guard import GuardPolicy, bound_hosts
from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.serve.lifecycle import Lifecycle, Stopper, drain, install_signals, supervise

API_KEY_ENV = "MAGNITUDE_API_KEY"
# After the grace period every stream has been ended; this bounds the wait for their last bytes.
SHUTDOWN_FLUSH_S = 3


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


def printable(text: str, limit: int = 80) -> str:
    """`text` as one harmless log field: a caller's `user` may hold newlines (a forged log line) or
    terminal escapes (ESC [ ... recolours or clears the operator's terminal); they are written
    escaped, and a long name is cut."""
    out = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return out if len(out) <= limit else out[:limit] + "..."


def refusal_line(caller: str, error: OpenAIError) -> str:
    """One line per call answered with an error before it ran (401, 400, 413, 429, 503)."""
    return f"{printable(caller)}  refused {error.status} {error.code}: {printable(error.message, 300)}"


def log_line(completion: Completion, outcome: Outcome) -> str:
    """One line per finished call: who, outcome, prompt (cached), tokens, queue, TTFT, tok/s, and
    the time spent in each phase (where a slow call lost its time: queued, prefill, generating)."""
    t = completion.timings() if completion.choices else {}
    u = completion.usage() if completion.choices else {}
    cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    parts = [f"{completion.id[:20]}", printable(completion.client_name), outcome.value]
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
                      started: asyncio.Event | None = None, hub: EngineHub | None = None,
                      lifecycle: Lifecycle | None = None, limits: ConnectionLimits = ConnectionLimits()) -> int:
    """Run the engine client, the hub and uvicorn until cancelled, the server stops, or (with a
    `lifecycle`) a signal or the supervisor asks it to stop; returns the process's exit status."""
    hub = hub or EngineHub(client)
    if options.guard is None:
        options = replace(options, guard=GuardPolicy(bound_hosts(host)))

    def log(text: str) -> None:
        print(f"[serve] {text}", file=out, flush=True)

    refusals = QuietLog(log)  # a line per refusal, but a flood of them cannot fill the disk
    api = create_app(hub, options, on_finish=lambda c, o: log(log_line(c, o)),
                     on_refused=lambda who, e: refusals(refusal_line(who, e)))
    quiet_loop_errors(asyncio.get_running_loop(), log)
    server = _QuietServer.make(api, host, port, limits)
    stopper = Stopper()
    tasks: list[asyncio.Task] = [asyncio.create_task(hub.run())]
    remove_signals = None
    if lifecycle is not None:
        if lifecycle.signals:
            remove_signals = install_signals(stopper)
        if lifecycle.restart is not None:
            hub.supervised = True
            tasks.append(asyncio.create_task(supervise(hub, client, lifecycle.restart, stopper, log)))
    log(f"http://{host}:{port}/v1 (model {options.model_name}); loading the engine...")
    tasks.append(asyncio.create_task(_announce_ready(hub, out, started)))
    serving = asyncio.create_task(server.serve())
    asked = asyncio.create_task(stopper.requested.wait())
    tasks.append(asked)
    try:
        await asyncio.wait({serving, asked}, return_when=asyncio.FIRST_COMPLETED)
        if stopper.stop is None:  # uvicorn ended by itself
            await serving
            return 0
        log(f"stopping: {stopper.stop.why}")
        _stop_listening(server)
        await drain(hub, lifecycle.grace_s if lifecycle else 0.0, stopper, log)
        # uvicorn closes idle connections and waits (bounded) for the last bytes of each stream.
        server.should_exit = True
        await serving
        log(f"stopped (exit status {stopper.stop.code})")
        return stopper.stop.code
    finally:
        # Cancelled (serve_in_thread's stop), uvicorn skips its shutdown: close the listening sockets.
        _stop_listening(server)
        if remove_signals is not None:
            remove_signals()
        serving.cancel()
        for task in tasks:
            task.cancel()
        client.stop()


def _stop_listening(server) -> None:
    for listening in getattr(server, "servers", ()):
        listening.close()


async def _announce_ready(hub: EngineHub, out: TextIO, started: asyncio.Event | None) -> None:
    from magnitude_tui.serve.hub import EngineState

    while hub.state is EngineState.LOADING:
        await asyncio.sleep(0.05)
    if hub.state is EngineState.READY:
        r = hub.ready
        assert r is not None  # READY comes with its EngineReady
        print(f"[serve] ready: {r.model} on {r.device}, n_ctx={r.n_ctx}, {r.n_seq_max} sequences, "
              f"policy {r.policy}", file=out, flush=True)
        if r.info.template_notice:  # no chat template: say so where the operator looks
            print(f"[serve] {r.info.template_notice}", file=out, flush=True)
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
    def make(api, host: str, port: int, limits: ConnectionLimits = ConnectionLimits()):
        import contextlib

        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

        # A bounded wait at shutdown: streams still open after it are cancelled, never waited for.
        return Server(uvicorn.Config(api, host=host, port=port, log_level="warning", lifespan="off",
                                     http=guarded_protocol(limits),
                                     timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]  # float seconds
                                     timeout_graceful_shutdown=SHUTDOWN_FLUSH_S))


class EmbeddedServer:
    """The endpoint of `magnitude-tui --serve PORT`: shares the TUI's engine client. The app's
    event pump hands every batch to `dispatch` before any screen sees it, so a reply never waits
    on the workspace; the workspace, once attached, opens a pane for every HTTP conversation."""

    def __init__(self, client, *, host: str, port: int, options: ServeOptions) -> None:
        self.hub = EngineHub(client)
        if options.guard is None:
            options = replace(options, guard=GuardPolicy(bound_hosts(host)))
        self.api = create_app(self.hub, options)
        self.host, self.port = host, port
        self.task: asyncio.Task | None = None

    def start(self, notify: Callable[..., None]) -> None:
        """Listen; `notify` says (in the app) when the endpoint stopped by itself."""
        server = _QuietServer.make(self.api, self.host, self.port)
        self.task = asyncio.ensure_future(server.serve())
        self.task.add_done_callback(lambda t: self._stopped(t, notify))

    def attach(self, workspace):
        """A pane per HTTP conversation from now on (serve/panes.py); returns the ApiPanes."""
        from magnitude_tui.serve.panes import ApiPanes

        return ApiPanes(self.hub, workspace)

    def _stopped(self, task: asyncio.Task, notify: Callable[..., None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None or not task.result():
            why = f": {error}" if error else " (is the port in use?)"
            notify(f"the HTTP endpoint on {self.host}:{self.port} stopped{why}", severity="error", timeout=15)

    def dispatch(self, batch: list) -> None:
        self.hub.dispatch(batch)
