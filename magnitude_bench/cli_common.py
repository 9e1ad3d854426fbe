"""Provides what the `magnitude-bench` commands share: the options every family declares alike, and
how a command ends (its tables printed, its result files written) and reports progress."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from magnitude_bench import options

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
PanesOpt = typer.Option(8, "--panes", help="Panes streaming at once.")
# Options whose flags and help several commands share but not their default, which each gives
# where it declares the option (`policy: PolicyArg = "target:50"`).
PolicyArg = Annotated[str, typer.Option("--policy", "-p")]
SeqsArg = Annotated[str, typer.Option("--seqs", help="Concurrent sequences.")]
RepsArg = Annotated[int, typer.Option("--reps", help="Repetitions (medians are reported).")]
SubagentGenArg = Annotated[int, typer.Option("--gen", help="Tokens each subagent generates.")]
NRunningArg = Annotated[int, typer.Option("--n-running", help="Sequences generating when the newcomer arrives.")]


def finish(result, out: Path, plot) -> None:
    from magnitude_bench.common import print_result, save_result

    print_result(result)
    paths = save_result(result, out, plot)
    Console().print("wrote " + ", ".join(str(p) for p in paths.values()))


def finish_on_backend(run, cfg, backend: str, model: Optional[str], device: str, threads: Optional[int],
                      ctx: Optional[int], out: Path, plot=None) -> None:
    """How an engine bench ends: `run(spec, cfg, progress=...)` on the backend its options name, then `finish`."""
    finish(run(options.backend_spec(backend, model, device, threads, ctx), cfg, progress=progress), out, plot)


def progress(msg: str) -> None:
    Console(stderr=True).print(f"[dim]{msg}[/]")
