"""Provides `magnitude-tui generate`: N prompts as concurrent sequences in one context, answers and
latency printed (or JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from magnitude_tui.cli_options import (
    ApiKeyEnvOpt,
    CtxOpt,
    DeviceOpt,
    DraftModelOpt,
    ModelOpt,
    PolicyOpt,
    RemoteModelOpt,
    RemoteOpt,
    SpecOpt,
    VerboseOpt,
    argv_text,
    check_model,
    fail,
    remote_client,
)

commands = typer.Typer()


@commands.command()
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
        fail(str(exc))

    if prompts is not None:
        try:
            lines = [l.strip() for l in prompts.read_text(encoding="utf-8").splitlines() if l.strip()]
        except (OSError, UnicodeDecodeError) as exc:  # missing, a directory, not text
            fail(f"cannot read --prompts {prompts}: {exc}")
    elif prompt:
        lines = [argv_text(prompt, "the prompt")] * n
    else:
        raise typer.BadParameter("give a prompt or --prompts FILE")
    if remote:
        client = remote_client(remote, remote_model, api_key_env)
    else:
        model_path = check_model(model, draft_model)
        from magnitude_tui import preflight

        try:
            n_ctx = preflight.check_context(n_ctx, model_path, max(preflight.DEFAULT_SEQS, len(lines)))
            preflight.check_numbers(n_ctx=n_ctx, threads=threads, temperature=temperature, max_tokens=max_tokens)
            preflight.check_policy(policy)
            spec_mode = preflight.check_spec(spec, draft_model)
            preflight.check_device(device)
        except preflight.OptionError as exc:
            fail(str(exc))
        client = local_client(len(lines), model=model_path, device=device, policy=policy, n_ctx=n_ctx,
                              verbose=verbose, threads=threads, draft_model=draft_model, spec=spec_mode)
    code = run_generate(lines, client, max_tokens=max_tokens, temperature=temperature, seed=seed, stream=stream,
                        json_out=json_out, tool_use=tool_use)
    raise typer.Exit(code)
