"""Provides the `magnitude-bench` commands that measure through an engine client over HTTP (serve,
llama-server, any OpenAI-compatible server): serve, remote."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from magnitude_bench import options
from magnitude_bench.cli_common import DeviceOpt, ModelOpt, OutOpt, RepsArg, SeqsArg, ThreadsOpt, finish, progress

commands = typer.Typer()


@commands.command("serve")
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
    finish(run_serve_bench(cfg, model=model, progress=progress), out, plot_serve)


@commands.command()
def remote(
    url: List[str] = typer.Option([], "--url", help="An OpenAI-compatible server (repeat for several)."),
    llama_server: int = typer.Option(0, "--llama-server", help="Instead of --url: start the vendored "
                                     "llama-server with this many slots on the same model and threads."),
    seqs: SeqsArg = "1,4,8", gen: int = typer.Option(64, "--gen", help="max_tokens per sequence (greedy)."),
    reps: RepsArg = 1,
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
        finish(bench_engines(engines, RemoteBenchConfig(seqs=widths, gen=gen, reps=reps), progress=progress),
                out, None)
