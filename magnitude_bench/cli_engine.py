"""Provides the `magnitude-bench` commands that measure the engine itself on a backend (llama.cpp or a
simulated GPU): admit, prefill-curve, throughput, spec, fork, person, resume, burst, target-depth."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from magnitude_bench import options
from magnitude_bench.cli_common import (
    BackendOpt,
    CpuClockOpt,
    CtxOpt,
    DeviceOpt,
    ModelOpt,
    NRunningArg,
    OneThreadOpt,
    OutOpt,
    PolicyArg,
    RepsArg,
    SeqsArg,
    SubagentGenArg,
    ThreadsOpt,
    finish,
    finish_on_backend,
    progress,
)

commands = typer.Typer()


@commands.command()
def admit(
    backend: List[str] = typer.Option(["llama", "simulated:rx9070xt"], "--backend", "-b",
                                      help="llama and/or simulated:<profile> (rx9070xt, cpu2core); repeatable."),
    n_running: NRunningArg = 8,
    running_depth: int = typer.Option(0, "--running-depth", help="The running sequences fork from a conversation "
                                      "this many tokens long, so they decode deep in a context (0: none)."),
    newcomer: int = typer.Option(0, "--newcomer", help="Newcomer prompt tokens (0: 8,000 simulated, else as many as the context allows)."),
    fixed: str = typer.Option("16,32,64,128,256,512,2048", "--fixed", help="Chunk sizes for the fixed:N policies."),
    targets: str = typer.Option("", "--targets", help="Target step times in ms (empty: 1.5x, 2x, 3x the undisturbed decode step)."),
    no_prefill_first: bool = typer.Option(False, "--no-prefill-first", help="Leave out the prefill-first policy."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = typer.Option(None, "--ctx", help="KV cells (default: 16384 real, 65536 simulated)."),
    out: Path = OutOpt,
) -> None:
    """N sequences generate; one long prompt arrives. Every policy: running tok/s, ITL, newcomer TTFT."""
    from magnitude_bench.admit import admit_result
    from magnitude_bench.plots import plot_admit

    cfg = options.admit_config(n_running=n_running, running_depth=running_depth, newcomer=newcomer, fixed=fixed,
                               targets=targets, no_prefill_first=no_prefill_first)
    specs = [options.backend_spec(b, model, device, threads, ctx) for b in backend]
    finish(admit_result(specs, cfg, progress=progress), out, plot_admit)


@commands.command("prefill-curve")
def prefill_curve(
    backend: str = BackendOpt,
    chunks: str = typer.Option(",".join(str(2 ** i) for i in range(12)), "--chunks", help="Prompt rows per step."),
    decode_rows: int = typer.Option(8, "--decode-rows", help="Decode rows beside the chunk in the second series."),
    seqs: str = typer.Option("1,2,4,8,12,16", "--seqs", help="Batch widths for the decode step curve."),
    reps: int = typer.Option(3, "--reps", help="Repetitions per point (median)."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Prefill tok/s for chunks of 1..2048 rows (alone and beside decode rows), decode step for 1..16 seqs, fit."""
    from magnitude_bench.plots import plot_prefill_curve
    from magnitude_bench.prefill_curve import CurveConfig, curve_result

    cfg = CurveConfig(chunks=options.ints(chunks), n_decode=decode_rows, seqs=options.ints(seqs), reps=reps)
    finish_on_backend(curve_result, cfg, backend, model, device, threads, ctx, out, plot_prefill_curve)


@commands.command()
def throughput(
    seqs: SeqsArg = "1,2,4,8,16", prompt: int = typer.Option(64, "--prompt", help="Prompt tokens per sequence."),
    gen: int = typer.Option(128, "--gen", help="Generated tokens per sequence (EOS ignored)."), reps: RepsArg = 3,
    policy: List[str] = typer.Option(["target:50", "fixed:2048"], "--policy", "-p",
                                     help="Engine policies; the first is 'this engine' in the ratios. Repeatable. "
                                     "POLICY+defaults runs it as the app launches (--spec auto, thread governor on)."),
    peers: str = typer.Option("batched-bench,server,serial", "--peers", help="Which peers to run."),
    require_tools: bool = typer.Option(False, "--require-tools", help="Fail if llama.cpp's tools are not built."),
    profile: bool = typer.Option(False, "--profile", help="Also cProfile one engine run at 8 sequences."),
    cpu_clock: bool = typer.Option(False, "--cpu-clock", help="Time the engine's runs in CPU seconds of its process "
                                   "(one thread only): the work done, whatever else a shared machine runs."),
    spec: str = typer.Option("off", "--spec", help="The engine's speculative decoding: off (the peers' work: none "
                             "of them speculates), ngram or auto."),
    who: str = typer.Option("agent", "--class", help="Whose requests: agent (what serve makes of API calls; "
                            "throughput-paced) or interactive (a person's turns, paced by the step target)."),
    flash_attn: str = typer.Option("auto", "--flash-attn", help="The engine's attention path: auto (the app's: "
                                   "the measured choice), on or off. The peers run llama.cpp's default (auto)."),
    paired: bool = typer.Option(False, "--paired", help="Run the engine and each llama.cpp peer at the same time, a "
                                "core each (--threads 1), the cores swapped every repetition: ratios from the same "
                                "minutes of a machine whose speed drifts."),
    runs: int = typer.Option(0, "--runs", help="With --paired: runs per side, policy and width (0: max(3, 8 / "
                             "sequences))."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Aggregate generated tok/s at 1..16 sequences: this engine vs llama-batched-bench, llama-server, serial Llama."""
    from magnitude_bench.peers import PeerError
    from magnitude_bench.plots import plot_throughput
    from magnitude_bench.throughput import run_throughput

    cfg = options.throughput_config(seqs=seqs, prompt=prompt, gen=gen, reps=reps, policy=policy, peers=peers,
                                    require_tools=require_tools, profile=profile, cpu_clock=cpu_clock, spec=spec,
                                    threads=threads, who=who, paired=paired, runs=runs)
    try:
        backend_cfg = options.flash_backend(flash_attn=flash_attn, backend="llama", model=model, device=device,
                                            threads=threads, ctx=ctx)
        result = run_throughput(backend_cfg, cfg, progress=progress)
    except (PeerError, RuntimeError) as e:
        Console(stderr=True).print(f"[red]{e}[/]")
        raise typer.Exit(1)
    finish(result, out, plot_throughput)


@commands.command("spec")
def spec_bench(
    seqs: str = typer.Option("1,2,4,8,16", "--seqs", help="Concurrent sequences (widths)."),
    tasks: str = typer.Option("repetitive,quoting,chat", "--tasks", help="Tasks: repetitive, quoting, chat."),
    modes: str = typer.Option("off,ngram,auto,draft", "--modes", help="--spec modes to compare (off first)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Longest reply per sequence (greedy; EOS "
                                             "ends it). Default: each task's own (repetitive 512, quoting 96, chat 64)."),
    reps: int = typer.Option(1, "--reps", help="Repetitions (modes alternate inside each; medians reported)."),
    min_tokens: int = typer.Option(1000, "--min-tokens", help="A width repeats beyond --reps (up to 3x) until "
                                   "its off runs made this many tokens: short batches are noisy."),
    policy: PolicyArg = "target:50",
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft GGUF for the draft mode "
                                              "(default: the model itself, an upper bound on acceptance)."),
    backend: str = typer.Option("llama", "--backend", "-b", help="llama, or simulated:<profile> (a smoke run)."),
    sim_profile: str = typer.Option("rx9070xt", "--sim-profile", help="The simulated GPU replaying the acceptance."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Also run llama-server with and without its n-gram speculation."),
    control: bool = typer.Option(False, "--control", help="Run off a second time in each repetition: what "
                                 "identical work reads against off on this machine, beside every ratio."),
    wall_clock: bool = typer.Option(False, "--wall-clock", help="Time in wall seconds instead of the engine "
                                    "process's CPU seconds (only meaningful on a quiet machine)."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    threads: int = typer.Option(1, "--threads", "-t", help="CPU threads (1: CPU time measures the work)."),
    flash_attn: str = typer.Option("auto", "--flash-attn", help="auto | on | off. On with 1 thread, llama.cpp "
                                   "computes a row alike in a batch of 1 or k rows, so greedy replies equal off's "
                                   "exactly at 1 sequence (docs/design/speculation.md)."),
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Speculative decoding: off / ngram / auto / draft at 1..16 sequences on three tasks, llama-server's
    own n-gram speculation beside it, and a simulated GPU replaying the measured acceptance."""
    from magnitude_bench.plots import plot_spec
    from magnitude_bench.spec import run_spec
    from magnitude_bench.spec_peer import run_peer

    cfg = options.spec_config(seqs=seqs, tasks=tasks, modes=modes, max_tokens=max_tokens, reps=reps, policy=policy,
                              min_tokens=min_tokens, draft_model=draft_model, wall_clock=wall_clock, peer=peer,
                              sim_profile=sim_profile, control=control)
    spec = options.flash_backend(flash_attn=flash_attn, backend=backend, model=model, device=device, threads=threads,
                                 ctx=ctx)
    real = spec.family == "llama"
    result = run_spec(spec, cfg, progress=progress, peer=run_peer if peer and real else None)
    finish(result, out, plot_spec)


@commands.command()
def fork(
    n: int = typer.Option(8, "--n", help="Subagents."),
    parent: int = typer.Option(1500, "--parent", help="Tokens of shared parent context."),
    task: int = typer.Option(32, "--task", help="Each subagent's own tokens after the shared context."),
    gen: SubagentGenArg = 8, policy: PolicyArg = "target:50", reps: int = typer.Option(1, "--reps"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """TTFT of N subagents forked from a long parent context vs the same N started cold."""
    from magnitude_bench.fork import ForkConfig, run_fork
    from magnitude_bench.plots import plot_fork

    cfg = ForkConfig(n=n, parent_tokens=parent, task_tokens=task, gen=gen, policy=policy, reps=reps)
    finish_on_backend(run_fork, cfg, backend, model, device, threads, ctx, out, plot_fork)


@commands.command()
def person(
    agents: int = typer.Option(8, "--agents", help="Agents generating when the prompt arrives."),
    prompt: int = typer.Option(1409, "--prompt", help="Tokens of the person's prompt."),
    policy: PolicyArg = "target:50", backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """A person's prompt TTFT beside N generating agents (agents yield, never yield) against the same prompt alone."""
    from magnitude_bench.person import PersonConfig, run_person

    cfg = PersonConfig(agents=agents, prompt=prompt, policy=policy)
    finish_on_backend(run_person, cfg, backend, model, device, threads, ctx, out)


@commands.command()
def resume(
    history: int = typer.Option(2000, "--history", help="Tokens of the conversation before the resume."),
    gen: int = typer.Option(8, "--gen", help="Tokens of the reply after the resume."),
    reps: int = typer.Option(3, "--reps", help="Cold and warm runs each (they alternate)."),
    policy: PolicyArg = "fixed:512",
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """TTFT of the first reply after a resume: the history prefilled again (cold) vs its KV restored from disk (warm)."""
    from magnitude_bench.resume import ResumeConfig, run_resume

    cfg = ResumeConfig(history_tokens=history, gen=gen, reps=reps, policy=policy)
    finish_on_backend(run_resume, cfg, "llama", model, device, threads, ctx, out)


@commands.command()
def burst(
    n: int = typer.Option(11, "--n", help="Subagents forked at once."),
    context: int = typer.Option(2000, "--context", "-L", help="Tokens of the conversation they fork from."),
    own: int = typer.Option(200, "--own", "-P", help="Each subagent's own prompt tokens."), gen: SubagentGenArg = 48,
    policy: List[str] = typer.Option(list(("target:50", "prefill-first", "fixed:2048", "target-v1:50")),
                                     "--policy", "-p", help="Policies to compare; repeatable."),
    flash: str = typer.Option("off,on", "--flash", help="Flash-attention settings to run (off,on)."),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    threads: int = OneThreadOpt, cpu_clock: bool = CpuClockOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """N subagents forked from a long conversation at once: TTFT, ITL and decode step at depth, every policy."""
    from magnitude_bench.burst import run_bursts

    cfg = options.burst_config(n=n, context=context, own=own, gen=gen, policy=policy, flash=flash,
                               cpu_clock=cpu_clock, threads=threads)
    finish_on_backend(run_bursts, cfg, backend, model, device, threads, ctx, out)


@commands.command("target-depth")
def target_depth(
    depths: str = typer.Option("0,2000,6000", "--depths", help="Depths of the conversation the running sequences fork from."),
    n_running: NRunningArg = 4,
    newcomer: int = typer.Option(1000, "--newcomer", help="Tokens of the prompt that arrives behind them."),
    target: float = typer.Option(50.0, "--target", help="target:MS wherever the decode rows plus a quantum fit in it."),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    threads: int = OneThreadOpt, cpu_clock: bool = CpuClockOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Does target:MS hold its target deep in a context? p50/p99 step against the target per depth."""
    from magnitude_bench.target_depth import TargetDepthConfig, run_target_depth

    options.check_cpu_clock(cpu_clock, threads)
    cfg = TargetDepthConfig(depths=options.ints(depths), n_running=n_running, newcomer=newcomer, target_ms=target,
                            cpu_clock=cpu_clock)
    finish_on_backend(run_target_depth, cfg, backend, model, device, threads, ctx, out)
