"""Provides `magnitude-tui serve`: the engine headless behind an OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import List, Optional

import typer

from magnitude_tui.cli_options import (
    CtxOpt,
    DeviceOpt,
    DraftModelOpt,
    KvRamOpt,
    ModelOpt,
    PolicyOpt,
    SpecOpt,
    VerboseOpt,
    fail,
)

commands = typer.Typer()


@commands.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (anything but loopback needs --api-key)."),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY' "
                                          "(or set MAGNITUDE_API_KEY)."),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    spec: str = SpecOpt,
    n_ctx: Optional[int] = CtxOpt,
    parallel: int = typer.Option(16, "--parallel", "-np", min=1, max=64, help="Sequences in the shared batch."),
    kv_streams: bool = typer.Option(False, "--kv-streams", metavar=" ", help="A KV cache stream per sequence "
                                    "(--ctx / --parallel cells each) in place of one shared pool: faster "
                                    "deep in long histories, where each sequence reads only its own cells; "
                                    "a fork copies its parent's cells instead of sharing them."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Engine CPU threads, fixed (default: "
                                          "chosen between steps from measured step times, up to all usable)."),
    max_live: int = typer.Option(64, "--max-queue", min=1, help="Requests in flight before 429."),
    draft_model: Optional[str] = DraftModelOpt,
    kv_ram_mb: int = KvRamOpt,
    verbose: bool = VerboseOpt,
    grace: float = typer.Option(5.0, "--grace", min=0, help="On SIGTERM/SIGINT, seconds the replies in flight "
                                "get to finish before they are ended with an error event."),
    max_restarts: int = typer.Option(5, "--max-restarts", min=0, help="Engine worker restarts within 10 "
                                     "minutes before serve gives up and exits non-zero."),
    allow_host: List[str] = typer.Option([], "--allow-host", help="Another name the server answers for "
                                         "in the Host header (besides the bound address; repeat for several)."),
    allow_origin: List[str] = typer.Option([], "--allow-origin", help="A web page origin allowed to call "
                                           "(scheme://host[:port], or *); pages are refused by default."),
    backend_kind: str = typer.Option("llama", "--backend", hidden=True, help="llama, fake or "
                                     "simulated:<profile> (paced in real time): tests and soak runs."),
) -> None:
    """Serve the engine headless as an OpenAI-compatible endpoint (/v1/chat/completions, /v1/models, /health)."""
    import asyncio

    from backend.factory import BackendConfig
    from magnitude_tui import preflight
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.serve.app import ServeOptions
    from magnitude_tui.serve.connections import raise_fd_limit
    from magnitude_tui.serve.guard import GuardPolicy, bound_hosts
    from magnitude_tui.serve.lifecycle import Lifecycle, RestartPolicy
    from magnitude_tui.serve.server import ServeConfigError, check_bind, resolve_api_key, serve_async, served_model_name

    # The app's checks, before the port opens: found by the engine worker, a bad --device or
    # --policy ended serve after "loading the engine", and --ctx 0 or 300 silently became 8192 or 512.
    try:
        if backend_kind == "llama":
            model_path = preflight.check_model(model)
            preflight.check_draft_model(draft_model, model_path)
            n_ctx = preflight.check_context(n_ctx, model_path, parallel)
            if kv_streams:
                preflight.check_streams(n_ctx, parallel)
            preflight.check_device(device)
        preflight.check_numbers(n_ctx=n_ctx, threads=threads)
        preflight.check_policy(policy)
        spec_mode = preflight.check_spec(spec, draft_model)
        preflight.check_megabytes("--kv-ram-mb", kv_ram_mb)
    except preflight.OptionError as exc:
        fail(str(exc))
    key = resolve_api_key(api_key)
    try:
        check_bind(host, key)
    except ServeConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    try:
        backend = BackendConfig(backend_kind, model=model, device=device, n_ctx=n_ctx, n_seq_max=parallel,
                                n_threads=threads, verbose=verbose, draft_model=draft_model, kv_streams=kv_streams,
                                realtime=backend_kind.startswith("simulated"))
    except ValueError as exc:
        fail(str(exc))
    client = WorkerClient(EngineConfig(backend, policy=policy, auto_threads=threads is None, spec=spec_mode,
                                       kv_ram_mb=kv_ram_mb),
                          log_path=None if verbose else "auto")
    raise_fd_limit()
    client.start()
    lifecycle = Lifecycle(grace_s=grace, restart=RestartPolicy(limit=max_restarts))
    code = asyncio.run(serve_async(client, host=host, port=port, lifecycle=lifecycle, options=ServeOptions(
        model_name=served_model_name(client), api_key=key, max_live=max_live,
        guard=GuardPolicy(bound_hosts(host, tuple(allow_host)), frozenset(allow_origin)))))
    raise typer.Exit(code)
