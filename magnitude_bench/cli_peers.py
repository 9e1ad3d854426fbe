"""Provides the `magnitude-bench` commands that set the engine beside others on one workload (busy
processes, llama-server with a schema, an agent trace): contention, structured, agents."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from magnitude_bench import options
from magnitude_bench.cli_common import CtxOpt, DeviceOpt, ModelOpt, OutOpt, SeqsArg, finish, progress

commands = typer.Typer()


@commands.command()
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
    finish(run_contention(cfg, progress=progress), out, None)


@commands.command()
def structured(
    seqs: SeqsArg = "1,8,16",
    max_tokens: int = typer.Option(48, "--max-tokens", help="Longest JSON reply (greedy)."),
    free_tokens: int = typer.Option(0, "--free-tokens", help="Longest free reply (0: as long as the JSON "
                                    "replies run at the warm-up, so both modes make the same tokens)."),
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
    from magnitude_bench.structured import StructuredConfig, run_structured

    if max_tokens < 1 or reps < 1 or clients < 1 or free_tokens < 0:
        raise typer.BadParameter("--max-tokens, --reps and --clients must be at least 1, --free-tokens at least 0")
    spec = options.any_backend(kind=backend, model=model, device=device, n_threads=threads, n_ctx=ctx)
    cfg = StructuredConfig(seqs=options.ints(seqs), max_tokens=max_tokens, free_tokens=free_tokens or None,
                           reps=reps, peer=peer, peer_clients=clients, threads=threads)
    finish(run_structured(spec, cfg, progress=progress), out, None)


@commands.command("kv-span")
def kv_span(
    prompt: int = typer.Option(1000, "--prompt", help="Prompt tokens per sequence (llama-batched-bench -npp)."),
    seqs: int = typer.Option(5, "--seqs", help="Sequences decoding at once (-npl)."),
    gen: int = typer.Option(24, "--gen", help="Tokens each sequence generates (-ntg)."),
    reps: int = typer.Option(2, "--reps", help="Repetitions (the layouts alternate which goes first)."),
    threads: int = typer.Option(1, "--threads", "-t", help="CPU threads."),
    flash_attn: str = typer.Option("on", "--flash-attn", help="llama.cpp's attention path: on or off."),
    model: Optional[str] = ModelOpt, out: Path = OutOpt,
) -> None:
    """What a unified KV cache's span costs a decode row: llama-batched-bench with a prompt per
    sequence, one prompt shared, and a cache stream per sequence."""
    from magnitude_bench.kv_span import KvSpanConfig, run_kv_span

    if min(prompt, seqs, gen, reps, threads) < 1 or flash_attn not in ("on", "off"):
        raise typer.BadParameter("--prompt, --seqs, --gen, --reps and --threads must be at least 1; "
                                 "--flash-attn on or off")
    cfg = KvSpanConfig(prompt=prompt, seqs=seqs, gen=gen, reps=reps, threads=threads, flash_attn=flash_attn,
                       model=model)
    finish(run_kv_span(cfg, progress=progress), out, None)


@commands.command("agents")
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
                              help="serve, engine, llama-server[+reuse][+ram], llama-server+serve-prompts (sent "
                                   "serve's rendering of each history: the same prompts, reported apart); "
                                   "llama-server+fa-off, serve+fa-on, serve+fa-off: on the attention path asked for; "
                                   "serve+spec-off: serve without speculation."),
    reps: int = typer.Option(2, "--reps", min=1, help="Repetitions (the sides alternate their order)."),
    parallel: int = typer.Option(0, "--parallel", min=0, help="llama-server -np and the engine's sequences "
                                 "(0: agents + the widest burst)."),
    backend: str = typer.Option("llama", "--backend", "-b", help="llama, or fake (a model-free smoke run)."),
    model: Optional[str] = ModelOpt,
    threads: int = typer.Option(1, "--threads", "-t", help="CPU threads, every side's (default 1: a shared machine)."),
    ctx: int = typer.Option(16384, "--ctx", help="KV cells, every side's."),
    exact_replies: bool = typer.Option(False, "--exact-replies", help="Every reply runs to its max_tokens on "
                                       "every side (ignore_eos): the same tokens generated everywhere."),
    paired: bool = typer.Option(False, "--paired", help="Exactly two sides, replaying at the same time, each "
                                "pinned to a core of its own (swapped every repetition): each ratio from the same "
                                "minutes of a machine whose speed drifts."),
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

        for path in write_default_traces(Path(__file__).resolve().parents[1]):
            Console().print(f"wrote {path}")
        return
    which = {"on": (True,), "off": (False,), "on,off": (True, False), "off,on": (False, True)}.get(bursts.replace(" ", ""))
    if which is None:
        raise typer.BadParameter("use on, off or on,off", param_hint="--bursts")
    with options.naming("--sides"):
        cfg = AgentsConfig(trace=str(trace) if trace else None, bursts=which, agents=agents, turns=turns,
                           k_max=k_max, think_scale=think_scale, sides=options.names(sides), reps=reps,
                           threads=threads, n_ctx=ctx, parallel=parallel, backend=backend, model=model,
                           exact_replies=exact_replies, paired=paired)
    finish(run_agents(cfg, progress=progress), out, plot_agents)
