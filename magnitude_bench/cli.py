"""Provides the `magnitude-bench` commands (typer): admit, prefill-curve, throughput, fork, person,
burst, target-depth, resume, remote, serve, soak, spec, contention, structured, agents, ui, ui-cpu, report."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from magnitude_bench import options

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure the claims: the admission stall, the prefill curve, throughput against llama.cpp, fork TTFT. "
         "Each command prints its tables and writes results/<name>-<timestamp>.json, .md and .png.",
)

ModelOpt = typer.Option(None, "--model", "-m", help="GGUF model path (default: SmolLM2-135M-Instruct Q4_1).")
DeviceOpt = typer.Option("cpu", "--device", "-d", help="auto | cpu | vulkan | vulkan:N")
ThreadsOpt = typer.Option(None, "--threads", "-t", help="CPU threads (default: all cores).")
OutOpt = typer.Option(Path("results"), "--out", help="Directory for the JSON, Markdown and PNG files.")
CtxOpt = typer.Option(None, "--ctx", help="Context size (default: 8192 real, 65536 simulated; fork/throughput: enough for the work).")
BackendOpt = typer.Option("llama", "--backend", "-b", help="llama or simulated:<profile>.")
# The commands that time single sequences deep in a context run one thread by default: the app's
# engine on a 2-core machine, and the only count --cpu-clock can time.
OneThreadOpt = typer.Option(1, "--threads", "-t", help="CPU threads (default 1: the app's engine on 2 cores).")
CpuClockOpt = typer.Option(False, "--cpu-clock", help="Time in CPU seconds of the engine's process (one "
                           "thread only): the work done, whatever else a shared machine runs.")


def _finish(result, out: Path, plot) -> None:
    from magnitude_bench.common import print_result, save_result

    console = Console()
    print_result(result)
    paths = save_result(result, out, plot)
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))


def _progress(msg: str) -> None:
    Console(stderr=True).print(f"[dim]{msg}[/]")



@bench_app.command()
def admit(
    backend: List[str] = typer.Option(["llama", "simulated:rx9070xt"], "--backend", "-b",
                                      help="llama and/or simulated:<profile> (rx9070xt, cpu2core); repeatable."),
    n_running: int = typer.Option(8, "--n-running", help="Sequences generating when the newcomer arrives."),
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
    _finish(admit_result(specs, cfg, progress=_progress), out, plot_admit)


@bench_app.command("prefill-curve")
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
    spec = options.backend_spec(backend, model, device, threads, ctx)
    _finish(curve_result(spec, cfg, progress=_progress), out, plot_prefill_curve)


@bench_app.command()
def throughput(
    seqs: str = typer.Option("1,2,4,8,16", "--seqs", help="Concurrent sequences."),
    prompt: int = typer.Option(64, "--prompt", help="Prompt tokens per sequence."),
    gen: int = typer.Option(128, "--gen", help="Generated tokens per sequence (EOS ignored)."),
    reps: int = typer.Option(3, "--reps", help="Repetitions (medians are reported)."),
    policy: List[str] = typer.Option(["target:50", "fixed:2048"], "--policy", "-p",
                                     help="Engine policies; the first is 'this engine' in the ratios. Repeatable."),
    peers: str = typer.Option("batched-bench,server,serial", "--peers", help="Which peers to run."),
    require_tools: bool = typer.Option(False, "--require-tools", help="Fail if llama.cpp's tools are not built."),
    profile: bool = typer.Option(False, "--profile", help="Also cProfile one engine run at 8 sequences."),
    cpu_clock: bool = typer.Option(False, "--cpu-clock", help="Time the engine's runs in CPU seconds of its process "
                                   "(one thread only): the work done, whatever else a shared machine runs."),
    spec: str = typer.Option("off", "--spec", help="The engine's speculative decoding: off (the peers' work: none "
                             "of them speculates), ngram or auto."),
    who: str = typer.Option("agent", "--class", help="Whose requests: agent (what serve makes of API calls; "
                            "throughput-paced) or interactive (a person's turns, paced by the step target)."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Aggregate generated tok/s at 1..16 sequences: this engine vs llama-batched-bench, llama-server, serial Llama."""
    from magnitude_bench.peers import PeerError
    from magnitude_bench.plots import plot_throughput
    from magnitude_bench.throughput import run_throughput

    cfg = options.throughput_config(seqs=seqs, prompt=prompt, gen=gen, reps=reps, policy=policy, peers=peers,
                                    require_tools=require_tools, profile=profile, cpu_clock=cpu_clock, spec=spec,
                                    threads=threads, who=who)
    try:
        result = run_throughput(options.backend_spec("llama", model, device, threads, ctx), cfg, progress=_progress)
    except PeerError as e:
        Console(stderr=True).print(f"[red]{e}[/]")
        raise typer.Exit(1)
    _finish(result, out, plot_throughput)


@bench_app.command("spec")
def spec_bench(
    seqs: str = typer.Option("1,2,4,8,16", "--seqs", help="Concurrent sequences (widths)."),
    tasks: str = typer.Option("repetitive,quoting,chat", "--tasks", help="Tasks: repetitive, quoting, chat."),
    modes: str = typer.Option("off,ngram,auto,draft", "--modes", help="--spec modes to compare (off first)."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", help="Longest reply per sequence (greedy; EOS "
                                             "ends it). Default: each task's own (repetitive 512, quoting 96, chat 64)."),
    reps: int = typer.Option(1, "--reps", help="Repetitions (modes alternate inside each; medians reported)."),
    min_tokens: int = typer.Option(1000, "--min-tokens", help="A width repeats beyond --reps (up to 3x) until "
                                   "its off runs made this many tokens: short batches are noisy."),
    policy: str = typer.Option("target:50", "--policy", "-p"),
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
    spec = options.spec_backend(flash_attn=flash_attn, backend=backend, model=model, device=device, threads=threads,
                                ctx=ctx)
    real = spec.family == "llama"
    result = run_spec(spec, cfg, progress=_progress, peer=run_peer if peer and real else None)
    _finish(result, out, plot_spec)


@bench_app.command()
def fork(
    n: int = typer.Option(8, "--n", help="Subagents."),
    parent: int = typer.Option(1500, "--parent", help="Tokens of shared parent context."),
    task: int = typer.Option(32, "--task", help="Each subagent's own tokens after the shared context."),
    gen: int = typer.Option(8, "--gen", help="Tokens each subagent generates."),
    policy: str = typer.Option("target:50", "--policy", "-p"),
    reps: int = typer.Option(1, "--reps"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """TTFT of N subagents forked from a long parent context vs the same N started cold."""
    from magnitude_bench.fork import ForkConfig, run_fork
    from magnitude_bench.plots import plot_fork

    cfg = ForkConfig(n=n, parent_tokens=parent, task_tokens=task, gen=gen, policy=policy, reps=reps)
    spec = options.backend_spec(backend, model, device, threads, ctx)
    _finish(run_fork(spec, cfg, progress=_progress), out, plot_fork)


@bench_app.command()
def person(
    agents: int = typer.Option(8, "--agents", help="Agents generating when the prompt arrives."),
    prompt: int = typer.Option(1409, "--prompt", help="Tokens of the person's prompt."),
    policy: str = typer.Option("target:50", "--policy", "-p"),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """A person's prompt TTFT beside N generating agents (agents yield, never yield) against the same prompt alone."""
    from magnitude_bench.person import PersonConfig, run_person

    cfg = PersonConfig(agents=agents, prompt=prompt, policy=policy)
    spec = options.backend_spec(backend, model, device, threads, ctx)
    _finish(run_person(spec, cfg, progress=_progress), out, None)


@bench_app.command()
def resume(
    history: int = typer.Option(2000, "--history", help="Tokens of the conversation before the resume."),
    gen: int = typer.Option(8, "--gen", help="Tokens of the reply after the resume."),
    reps: int = typer.Option(3, "--reps", help="Cold and warm runs each (they alternate)."),
    policy: str = typer.Option("fixed:512", "--policy", "-p"),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """TTFT of the first reply after a resume: the history prefilled again (cold) vs its KV restored from disk (warm)."""
    from magnitude_bench.resume import ResumeConfig, run_resume

    cfg = ResumeConfig(history_tokens=history, gen=gen, reps=reps, policy=policy)
    _finish(run_resume(options.backend_spec("llama", model, device, threads, ctx), cfg, progress=_progress), out, None)


@bench_app.command()
def burst(
    n: int = typer.Option(11, "--n", help="Subagents forked at once."),
    context: int = typer.Option(2000, "--context", "-L", help="Tokens of the conversation they fork from."),
    own: int = typer.Option(200, "--own", "-P", help="Each subagent's own prompt tokens."),
    gen: int = typer.Option(48, "--gen", help="Tokens each subagent generates."),
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
    _finish(run_bursts(options.backend_spec(backend, model, device, threads, ctx), cfg, progress=_progress), out, None)


@bench_app.command("target-depth")
def target_depth(
    depths: str = typer.Option("0,2000,6000", "--depths", help="Depths of the conversation the running sequences fork from."),
    n_running: int = typer.Option(4, "--n-running", help="Sequences generating when the newcomer arrives."),
    newcomer: int = typer.Option(1000, "--newcomer", help="Tokens of the prompt that arrives behind them."),
    target: float = typer.Option(50.0, "--target", help="target:MS wherever the decode rows plus a quantum fit in it."),
    backend: str = BackendOpt,
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    threads: int = OneThreadOpt, cpu_clock: bool = CpuClockOpt,
    ctx: Optional[int] = CtxOpt, out: Path = OutOpt,
) -> None:
    """Does target:MS hold its target deep in a context? p50/p99 step against the target per depth."""
    from magnitude_bench.target_depth import run_target_depth

    cfg = options.target_depth_config(depths=depths, n_running=n_running, newcomer=newcomer, target=target,
                                      cpu_clock=cpu_clock, threads=threads)
    spec = options.backend_spec(backend, model, device, threads, ctx)
    _finish(run_target_depth(spec, cfg, progress=_progress), out, None)


@bench_app.command("serve")
def serve_bench(
    seqs: str = typer.Option("1,4,8,16", "--seqs", help="Concurrent HTTP clients."),
    gen: int = typer.Option(48, "--gen", help="Tokens each call asks for (greedy)."),
    agents: int = typer.Option(16, "--agents", help="Agent requests in front of the person's turn."),
    peers: str = typer.Option("serve,llama-server", "--peers", help="serve and/or llama-server."),
    reps: int = typer.Option(1, "--reps", min=1, help="Repetitions of the clients part, alternating "
                             "which peer goes first (the ratio is their median)."),
    parts: str = typer.Option("clients,admission,priority", "--parts",
                              help="Which parts to run: clients, admission, priority."),
    model: Optional[str] = ModelOpt, threads: Optional[int] = ThreadsOpt, out: Path = OutOpt,
) -> None:
    """N concurrent clients against `serve` and llama-server -np N; a long prompt over HTTP; a person behind agents."""
    from magnitude_bench.plots import plot_serve
    from magnitude_bench.serve_load import run_serve_bench

    cfg = options.serve_config(seqs=seqs, gen=gen, agents=agents, peers=peers, reps=reps, parts=parts,
                               threads=threads)
    _finish(run_serve_bench(cfg, model=model, progress=_progress), out, plot_serve)



@bench_app.command()
def remote(
    url: List[str] = typer.Option([], "--url", help="An OpenAI-compatible server (repeat for several)."),
    llama_server: int = typer.Option(0, "--llama-server", help="Instead of --url: start the vendored "
                                     "llama-server with this many slots on the same model and threads."),
    seqs: str = typer.Option("1,4,8", "--seqs", help="Concurrent sequences."),
    gen: int = typer.Option(64, "--gen", help="max_tokens per sequence (greedy)."),
    reps: int = typer.Option(1, "--reps", help="Repetitions (medians are reported)."),
    remote_model: Optional[str] = typer.Option(None, "--remote-model", help="The served model (default: the first listed)."),
    local: bool = typer.Option(False, "--local", help="Also run the same work on the local engine (same model file)."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, threads: Optional[int] = ThreadsOpt,
    out: Path = OutOpt,
) -> None:
    """Client-side aggregate tok/s and TTFT of 1..N concurrent sequences on a server; --local adds the local engine."""
    from magnitude_bench.remote import RemoteBenchConfig, bench_engines
    from magnitude_bench.remote_setup import remote_engines

    widths = options.ints(seqs)
    with remote_engines(url, llama_server, widths=widths, gen=gen, remote_model=remote_model, local=local,
                        model=model, device=device, threads=threads) as engines:
        _finish(bench_engines(engines, RemoteBenchConfig(seqs=widths, gen=gen, reps=reps), progress=_progress),
                out, None)


@bench_app.command()
def ui(
    panes: int = typer.Option(8, "--panes", help="Panes streaming at once."),
    max_tokens: int = typer.Option(96, "--max-tokens", help="Tokens per reply (greedy; the model may stop early)."),
    keys: int = typer.Option(30, "--keys", help="Keypresses measured per UI run (while panes stream)."),
    interval: float = typer.Option(0.12, "--interval", help="Seconds between keypresses."),
    reps: int = typer.Option(2, "--reps", help="headless/ui pairs per thread setting, run alternately."),
    threads: str = typer.Option("", "--threads", "-t", help="Comma-separated engine thread counts to compare "
                                                           "(empty: the engine default)."),
    backend: str = typer.Option("llama", "--backend", "-b", help="llama | fake | simulated:<profile>."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    ctx: int = typer.Option(4096, "--ctx", help="Context size."),
    out: Path = OutOpt,
) -> None:
    """Keypress-to-screen latency while N panes stream, and the engine step time with the UI vs headless."""
    from magnitude_bench.ui import UiConfig, run_ui_bench

    th = options.ints(threads) or (None,)
    config = options.ui_engine_config(backend=backend, device=device, model=model, ctx=ctx)
    cfg = UiConfig(panes=panes, max_tokens=max_tokens, keys=keys, key_interval_s=interval, reps=reps, threads=th)
    _finish(run_ui_bench(config, cfg, progress=_progress), out, None)


@bench_app.command("ui-cpu")
def ui_cpu(
    panes: int = typer.Option(8, "--panes", help="Panes streaming at once."),
    rate: float = typer.Option(25.0, "--rate", help="Engine steps per second (one token per pane per step)."),
    seconds: float = typer.Option(10.0, "--seconds", help="Length of the measured window."),
    reps: int = typer.Option(1, "--reps", help="Runs, one after another (each a fresh app)."),
    sequences: bool = typer.Option(False, "--sequences", help="With the sequences panel (f2) open."),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Write a cProfile of the measured window here."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write every run's figures here as JSON."),
) -> None:
    """The app's own CPU per wall second and keypress latency while N panes stream, on a stand-in
    engine (no model: nothing else competes for the CPU, so it is cheap to repeat)."""
    import json
    import statistics

    from magnitude_bench.ui_cpu import CpuConfig, run_cpu_bench

    cfg = CpuConfig(panes=panes, step_hz=rate, duration_s=seconds, show_sequences=sequences,
                    profile=str(profile) if profile else None)
    results = run_cpu_bench(cfg, reps=reps)
    for r in results:
        print(r.summary())
    if reps > 1:
        print(f"median app_cores {statistics.median(r.app_cores for r in results):.3f}")
    if json_out is not None:
        from dataclasses import asdict

        json_out.write_text(json.dumps([asdict(r) for r in results], indent=1))

@bench_app.command()
def soak(
    fake_ops: int = typer.Option(100_000, "--fake-ops", help="State-machine operations on the fake backend."),
    real_ops: int = typer.Option(2_000, "--real-ops", help="State-machine operations on the real model."),
    kills: int = typer.Option(10, "--kills", help="Worker kill -9 rounds."),
    rounds: int = typer.Option(20, "--rounds", help="Rounds of the bad-input table."),
    floods: int = typer.Option(5, "--floods", help="Floods of 64 requests."),
    dbs: int = typer.Option(25, "--dbs", help="Damaged database files."),
    app_kills: int = typer.Option(5, "--app-kills", help="App kill -9 rounds while 8 panes stream."),
    contention_reps: int = typer.Option(2, "--contention-reps", help="Rounds of every variant under each load."),
    ui_flood: int = typer.Option(100_000, "--ui-flood", help="Tokens into one pane in the UI endurance run."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated scenarios (default: all; "
                                       "the names are listed in docs/RELIABILITY.md)."),
    seed: int = typer.Option(1, "--seed"),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt, out: Path = OutOpt,
) -> None:
    """The reliability scenarios, long: state machines, bad inputs, flood, kill -9, damaged databases."""
    from magnitude_bench.soak import SoakConfig, run_soak

    chosen = options.soak_scenarios(only)
    cfg = SoakConfig(fake_ops=fake_ops, real_ops=real_ops, bad_rounds=rounds, flood_rounds=floods,
                     kill_rounds=kills, db_rounds=dbs, app_kill_rounds=app_kills, seed=seed, model=model, device=device,
                     contention_reps=contention_reps, ui_flood=ui_flood)
    result = run_soak(cfg, chosen, progress=_progress)
    _finish(result, out, None)
    if result.data["failures"]:
        raise typer.Exit(1)


@bench_app.command()
def contention(
    seqs: int = typer.Option(8, "--seqs", help="Concurrent sequences (llama-batched-bench -npl)."),
    gen: int = typer.Option(32, "--gen", help="Tokens generated per sequence (-ntg)."),
    reps: int = typer.Option(2, "--reps", help="Rounds of every variant under each load."),
    loads: Optional[str] = typer.Option(None, "--loads", help="Busy processes per load, comma-separated "
                                        "(default: 0, 1 and one per core)."),
    fixed: bool = typer.Option(False, "--fixed", help="Also run the engine with every core, fixed (the old default)."),
    model: Optional[str] = ModelOpt, out: Path = OutOpt,
) -> None:
    """The engine beside busy processes: tok/s against its quiet figure and llama-batched-bench -t 1..cores."""
    from magnitude_bench.contention import ContentionConfig, run_contention

    cfg = ContentionConfig(seqs=seqs, gen=gen, reps=reps, loads=options.ints(loads) if loads else None,
                           engine_fixed=fixed, model=model)
    _finish(run_contention(cfg, progress=_progress), out, None)


@bench_app.command()
def structured(
    seqs: str = typer.Option("1,8,16", "--seqs", help="Concurrent sequences."),
    max_tokens: int = typer.Option(48, "--max-tokens", help="Longest reply, the same in both modes (greedy)."),
    reps: int = typer.Option(2, "--reps", help="Repetitions (the modes alternate which goes first)."),
    peer: bool = typer.Option(True, "--peer/--no-peer", help="Also run llama-server with the same schema."),
    clients: int = typer.Option(8, "--clients", help="llama-server slots and concurrent HTTP clients."),
    backend: str = typer.Option("llama", "--backend", "-b", help="llama, fake or simulated:<profile> (a smoke run)."),
    model: Optional[str] = ModelOpt, device: str = DeviceOpt,
    threads: int = typer.Option(1, "--threads", "-t", help="CPU threads, the engine's and llama-server's "
                                "(default 1: on a shared 2-core machine spinning thread barriers dominate)."),
    ctx: Optional[int] = CtxOpt,
    out: Path = typer.Option(Path("docs/benchmarks"), "--out", help="Directory for the JSON and Markdown files."),
) -> None:
    """json_schema-constrained replies vs free text at 1..16 sequences on the same engine, and vs
    llama-server with the same schema: aggregate tok/s, ratios, the grammar's share."""
    from backend.factory import BackendConfig
    from magnitude_bench.structured import StructuredConfig, run_structured

    if max_tokens < 1 or reps < 1 or clients < 1:
        raise typer.BadParameter("--max-tokens, --reps and --clients must be at least 1")
    try:
        spec = BackendConfig(kind=backend, model=model, device=device, n_threads=threads, n_ctx=ctx)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--backend") from None
    cfg = StructuredConfig(seqs=options.ints(seqs), max_tokens=max_tokens, reps=reps, peer=peer,
                           peer_clients=clients, threads=threads)
    _finish(run_structured(spec, cfg, progress=_progress), out, None)


@bench_app.command("agents")
def agents_bench(
    trace: Optional[Path] = typer.Option(None, "--trace", help="A trace file (default: the repository's, "
                                         "magnitude_bench/traces/, with and without bursts)."),
    bursts: str = typer.Option("on,off", "--bursts", help="Which default traces: on, off or both."),
    agents: int = typer.Option(4, "--agents", min=1, help="The trace's first M agents (1, 4, 8, 16)."),
    turns: int = typer.Option(3, "--turns", min=0, help="Each agent's first T turns."),
    k_max: int = typer.Option(600, "--k-max", min=1, help="Cut each tool result to this many tokens "
                              "(3000: the trace as generated)."),
    think_scale: float = typer.Option(1.0, "--think-scale", min=0.0, help="Scale the think times (0: none)."),
    sides: str = typer.Option(",".join(["serve", "engine", "llama-server", "llama-server+reuse",
                                        "llama-server+ram", "llama-server+reuse+ram"]), "--sides",
                              help="serve, engine, llama-server[+reuse][+ram]."),
    reps: int = typer.Option(2, "--reps", min=1, help="Repetitions (the sides alternate their order)."),
    parallel: int = typer.Option(0, "--parallel", min=0, help="llama-server -np and the engine's sequences "
                                 "(0: agents + the widest burst)."),
    backend: str = typer.Option("llama", "--backend", "-b", help="llama, or fake (a model-free smoke run)."),
    model: Optional[str] = ModelOpt,
    threads: int = typer.Option(1, "--threads", "-t", help="CPU threads, every side's (default 1: a shared machine)."),
    ctx: int = typer.Option(16384, "--ctx", help="KV cells, every side's."),
    generate: bool = typer.Option(False, "--generate-traces", help="Regenerate the repository's traces "
                                  "(seed 23, 16 agents, 6 turns) from its source files, and exit."),
    out: Path = typer.Option(Path("docs/benchmarks"), "--out", help="Directory for the JSON, Markdown and PNG files."),
) -> None:
    """A seeded agent trace (tool results, think times, subagent bursts) replayed against serve,
    the engine and llama-server -np N (unified KV, cache_prompt, with/without --cache-reuse and
    --cache-ram): makespan, TTFT, prompt tokens evaluated vs the trace's minimum, KV over time."""
    from magnitude_bench.agents import AgentsConfig, run_agents
    from magnitude_bench.agents_report import plot_agents

    if generate:
        from magnitude_bench.agents_trace import write_default_traces

        for path in write_default_traces(Path(__file__).resolve().parents[2]):
            Console().print(f"wrote {path}")
        return
    which = {"on": (True,), "off": (False,), "on,off": (True, False), "off,on": (False, True)}.get(bursts.replace(" ", ""))
    if which is None:
        raise typer.BadParameter("use on, off or on,off", param_hint="--bursts")
    try:
        cfg = AgentsConfig(trace=str(trace) if trace else None, bursts=which, agents=agents, turns=turns,
                           k_max=k_max, think_scale=think_scale, sides=options.names(sides), reps=reps,
                           threads=threads, n_ctx=ctx, parallel=parallel, backend=backend, model=model)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--sides") from None
    _finish(run_agents(cfg, progress=_progress), out, plot_agents)


@bench_app.command()
def report(
    folder: Optional[Path] = typer.Option(None, "--from", help="The folder of raw results (default: docs/benchmarks)."),
    check: bool = typer.Option(False, "--check", help="Only say whether the pages match the raw results."),
) -> None:
    """Rebuild the generated sections of docs/BENCHMARKS.md and docs/BENCHMARKS-HISTORY.md from raw results."""
    from magnitude_bench.report import RAW_DIR, stale, write

    folder = folder or RAW_DIR
    if check:
        pages = stale(folder=folder)
        for p in pages:
            Console(stderr=True).print(f"{p} differs from the raw results under {folder}")
        raise typer.Exit(1 if pages else 0)
    for p in write(folder=folder):
        Console().print(f"wrote {p}")


if __name__ == "__main__":
    bench_app()
