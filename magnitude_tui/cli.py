"""Provides the magnitude-tui command line (typer): the app itself (no subcommand) and the commands of
cli_devices, cli_generate, cli_serve and cli_run, in the order `--help` lists them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from magnitude_tui import cli_devices, cli_generate, cli_run, cli_serve
from magnitude_tui.cli_options import (
    ApiKeyEnvOpt,
    CtxOpt,
    DeviceOpt,
    DraftModelOpt,
    KvRamOpt,
    ModelOpt,
    PolicyOpt,
    RemoteModelOpt,
    RemoteOpt,
    SpecOpt,
    VerboseOpt,
    fail,
    remote_client,
)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="Run several local LLM agents at once in one llama.cpp context, and watch what they do to each other.",
)


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
    kv_ram_mb: int = KvRamOpt,
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
        preflight.check_megabytes("--kv-disk-mb", kv_disk_mb)
        preflight.check_megabytes("--kv-ram-mb", kv_ram_mb)
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
        fail(str(exc))
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
        engine = remote_client(remote, remote_model, api_key_env)
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
                              kv_ram_mb=kv_ram_mb,
                              spec=spec_mode)
    # --serve exposes the local engine; a remote one is already a server.
    serving: dict[str, Any] = {} if remote else {"serve_port": serve_port, "api_key": resolve_api_key(api_key)}
    from magnitude_tui.terminal_input import lenient_terminal_input

    lenient_terminal_input()  # a byte that is not UTF-8 typed or pasted ended the app
    try:
        failure = run_app(engine, theme=theme, resume=resume, sampling=sampling, export_dir=export_dir,
                          roles=RoleBook(agents or agents_path(), roles), workdir=workdir.resolve(), **serving)
    except StoreError as exc:
        fail(str(exc), code=1)
    if failure:
        fail(failure, code=1)


for family in (cli_devices, cli_generate, cli_serve, cli_run):
    app.registered_commands += family.commands.registered_commands


@app.command(hidden=True, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context) -> None:
    """The benchmarks moved to their own command; this says where (the app never imports them)."""
    fail("the benchmarks are the magnitude-bench command: magnitude-bench " + " ".join(ctx.args)
         + "\n(installed with the bench extra: pip install 'magnitude-tui[bench]')")


def run() -> None:
    app()


if __name__ == "__main__":
    run()
