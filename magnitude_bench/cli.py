"""Provides the `magnitude-bench` app (typer): the commands of each family, cli_engine (the engine on a
backend), cli_serve (through a client or HTTP), cli_ui (the app, soak), cli_peers (the engine beside
others on one workload), in the order `--help` lists them, and last its own, `report`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from magnitude_bench import cli_engine, cli_peers, cli_serve, cli_ui

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure the claims: the admission stall, the prefill curve, throughput against llama.cpp, fork TTFT. "
         "Each command prints its tables and writes results/<name>-<timestamp>.json, .md and .png.",
)
for family in (cli_engine, cli_serve, cli_ui, cli_peers):
    bench_app.registered_commands += family.commands.registered_commands


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
