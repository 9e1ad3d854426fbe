"""Provides `magnitude-tui run`: one agent loop on a task to its end, without the TUI."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from magnitude_tui.cli_options import (
    ApiKeyEnvOpt,
    CtxOpt,
    DeviceOpt,
    ModelOpt,
    PolicyOpt,
    RemoteModelOpt,
    RemoteOpt,
    VerboseOpt,
    argv_text,
    fail,
    remote_client,
)

commands = typer.Typer()


@commands.command("run")
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
        fail(str(exc))
    task = argv_text(task, "the task")
    if remote:
        client = remote_client(remote, remote_model, api_key_env)
    else:
        from magnitude_tui.generate import local_client

        client = local_client(16, model=model_path, device=device,
                              policy=policy, n_ctx=n_ctx, verbose=verbose, backend=backend_kind, threads=threads)
    opts = RunOptions(task, workdir, role, policy_choice, json_out, max_turns,
                      SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed))
    code = asyncio.run(run_on_client(opts, client, roles=roles, file_config=file_config,
                                     approval=terminal_approval()))
    raise typer.Exit(code)
