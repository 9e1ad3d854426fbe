"""Provides `magnitude-bench report`: the benchmarks pages rebuilt from the raw results."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

commands = typer.Typer()


@commands.command()
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
