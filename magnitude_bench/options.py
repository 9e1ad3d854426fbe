"""The `bench` commands' argument checks and config building: each function takes a command's option
values as typed and returns its config, or raises `typer.BadParameter` naming the option at fault.

Only typer at import time (the commands import this module); each bench's config class is imported
where it is built."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Optional, Sequence

import typer


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers ("1,4,8"); blanks between commas are skipped."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names, stripped, blanks skipped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def choices(text: str, allowed, what: str, hint: str, say: str = "choose from") -> tuple[str, ...]:
    """`names(text)`, each one of `allowed`; else BadParameter naming the first that is not."""
    chosen = names(text)
    bad = [x for x in chosen if x not in allowed]
    if bad:
        raise typer.BadParameter(f"unknown {what} {bad[0]!r}: {say} {', '.join(allowed)}", param_hint=hint)
    return chosen


@contextmanager
def naming(hint: str, errors: type[Exception] = ValueError) -> Iterator[None]:
    """A ValueError (or `errors`) raised inside stops the command with BadParameter naming the option `hint`."""
    try:
        yield
    except errors as exc:
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def any_backend(**kw):
    """A `BackendConfig` of any kind the app takes (fake included), or BadParameter naming --backend."""
    from backend.factory import BackendConfig

    with naming("--backend"):
        return BackendConfig(**kw)


def backend_spec(kind: str, model: Optional[str], device: str, threads: Optional[int], ctx: Optional[int]):
    """The `BackendConfig` of a bench that runs the real model or a simulated profile."""
    from backend.factory import BackendConfig

    if not (kind == "llama" or kind.startswith("simulated")):
        raise typer.BadParameter(f"unknown backend {kind!r}: use 'llama' or 'simulated:<profile>'",
                                 param_hint="--backend")
    return BackendConfig(kind=kind, model=model, device=device, n_threads=threads, n_ctx=ctx)


def check_cpu_clock(cpu_clock: bool, threads: Optional[int]) -> None:
    """CPU seconds of the engine's process measure its work only when one thread does it."""
    if cpu_clock and threads != 1:
        raise typer.BadParameter("CPU-time measurement needs one thread (--threads 1)", param_hint="--cpu-clock")


def admit_config(*, n_running: int, running_depth: int, newcomer: int, fixed: str, targets: str,
                 no_prefill_first: bool):
    from magnitude_bench.admit import AdmitConfig

    try:
        tgt = tuple(float(x) for x in targets.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"expected milliseconds like 50,75, got {targets!r}", param_hint="--targets") from None
    return AdmitConfig(n_running=n_running, running_depth=running_depth, newcomer_tokens=newcomer, fixed=ints(fixed),
                       targets=tgt, prefill_first=not no_prefill_first)


def throughput_config(*, seqs: str, prompt: int, gen: int, reps: int, policy: Sequence[str], peers: str,
                      require_tools: bool, profile: bool, cpu_clock: bool, spec: str, threads: Optional[int],
                      who: str = "agent", paired: bool = False, runs: int = 0):
    check_cpu_clock(cpu_clock, threads)
    from magnitude_bench.throughput import APP_DEFAULTS, PEERS, ThroughputConfig, paired_problem
    from scheduler.budget import parse_policy
    from scheduler.speculation import SpecMode, parse_spec_mode
    from scheduler.types import Priority

    chosen = choices(peers, PEERS, "peer", "--peers")
    with naming("--spec"):
        spec_mode = parse_spec_mode(spec)
    if spec_mode is SpecMode.DRAFT:
        raise typer.BadParameter("draft needs a draft model, which bench throughput does not load: use off, ngram "
                                 "or auto (bench spec measures draft)", param_hint="--spec")
    for p in policy:
        text, _, variant = p.partition("+")
        with naming("--policy"):
            parse_policy(text)
        if variant not in ("", APP_DEFAULTS):
            raise typer.BadParameter(f"{p!r}: a policy may end in +{APP_DEFAULTS} (the app's defaults: --spec "
                                     "auto, the thread governor on), nothing else", param_hint="--policy")
    if who not in ("agent", "interactive"):
        raise typer.BadParameter(f"expected agent or interactive, got {who!r}", param_hint="--class")
    problem = paired_problem(threads, chosen) if paired else None
    if problem:
        raise typer.BadParameter(problem, param_hint="--paired")
    if runs < 0 or (runs and not paired):
        raise typer.BadParameter("runs per side are for --paired, and at least 1 (0: the default)",
                                 param_hint="--runs")
    return ThroughputConfig(seqs=ints(seqs), prompt=prompt, gen=gen, reps=reps, policies=tuple(policy),
                            peers=chosen, require_tools=require_tools, profile=profile, cpu_clock=cpu_clock,
                            spec=spec_mode, priority=Priority[who.upper()], paired=paired, pair_runs=runs)


def spec_config(*, seqs: str, tasks: str, modes: str, max_tokens: Optional[int], reps: int, policy: str,
                min_tokens: int = 1000, control: bool = False,
                draft_model: Optional[str], wall_clock: bool, peer: bool, sim_profile: str):
    from magnitude_bench.spec import SpecBenchConfig
    from magnitude_bench.spec_tasks import Task
    from scheduler.speculation import parse_spec_mode

    chosen_tasks = choices(tasks, [t.value for t in Task], "task", "--tasks", say="use")
    with naming("--modes"):
        chosen_modes = tuple(parse_spec_mode(m).value for m in modes.split(",") if m.strip())
    if max_tokens is not None and max_tokens < 1:
        raise typer.BadParameter(f"expected at least 1, got {max_tokens}", param_hint="--max-tokens")
    if not chosen_modes or chosen_modes[0] != "off":
        raise typer.BadParameter("the modes must start with off (every ratio is to it)", param_hint="--modes")
    return SpecBenchConfig(widths=ints(seqs), tasks=chosen_tasks, modes=chosen_modes, max_tokens=max_tokens,
                           reps=reps, min_tokens=min_tokens, policy=policy, draft_model=draft_model, cpu_clock=not wall_clock,
                           peer=peer, sim_profile=sim_profile, control=control)


def flash_backend(*, flash_attn: str, backend: str, model: Optional[str], device: str, threads: Optional[int],
                  ctx: Optional[int]):
    """The backend of `bench spec` and `bench throughput`: `backend_spec` with their --flash-attn setting."""
    if flash_attn.strip().lower() not in ("auto", "on", "off"):
        raise typer.BadParameter(f"expected auto, on or off, got {flash_attn!r}", param_hint="--flash-attn")
    return replace(backend_spec(backend, model, device, threads, ctx), flash_attn=flash_attn.strip().lower())


def burst_config(*, n: int, context: int, own: int, gen: int, policy: Sequence[str], flash: str, cpu_clock: bool,
                 threads: Optional[int]):
    check_cpu_clock(cpu_clock, threads)
    from magnitude_bench.burst import BurstConfig

    flashes = names(flash)
    if not flashes or any(f not in ("on", "off") for f in flashes):
        raise typer.BadParameter(f"expected on and/or off, got {flash!r}", param_hint="--flash")
    return BurstConfig(n=n, context=context, own=own, gen=gen, policies=tuple(policy), flash=flashes,
                       cpu_clock=cpu_clock)


SERVE_PARTS = ("clients", "admission", "priority")


def serve_config(*, seqs: str, gen: int, agents: int, peers: str, reps: int, parts: str, threads: Optional[int]):
    from backend import usable_cpus
    from magnitude_bench.serve_load import ServeBenchConfig

    chosen = names(parts)
    if set(chosen) - set(SERVE_PARTS) or not chosen:
        raise typer.BadParameter(f"expected some of clients, admission, priority; got {parts!r}",
                                 param_hint="--parts")
    return ServeBenchConfig(seqs=ints(seqs), gen=gen, priority_agents=agents, threads=threads or usable_cpus(),
                            peers=names(peers), reps=reps, parts=chosen)


def ui_engine_config(*, backend: str, device: str, model: Optional[str], ctx: int):
    """`bench ui`'s engine: any backend kind the app takes (fake included)."""
    from magnitude_tui.engine.events import EngineConfig

    return EngineConfig(backend=any_backend(kind=backend, device=device, model=model, n_ctx=ctx))


def soak_scenarios(only: Optional[str]) -> tuple[str, ...]:
    """The scenarios `--only` names (all when it is not given)."""
    from magnitude_bench.soak import SCENARIOS

    return choices(only, SCENARIOS, "scenario", "--only") if only else tuple(SCENARIOS)
