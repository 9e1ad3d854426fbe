"""Provides the `magnitude-bench` app (typer): the commands of each family, cli_engine (the engine on a
backend), cli_serve (through a client or HTTP), cli_ui (the app, soak), cli_peers (the engine beside
others on one workload) and cli_report, in the order `--help` lists them."""

from __future__ import annotations

import typer

from magnitude_bench import cli_engine, cli_peers, cli_report, cli_serve, cli_ui

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure the claims: the admission stall, the prefill curve, throughput against llama.cpp, fork TTFT. "
         "Each command prints its tables and writes results/<name>-<timestamp>.json, .md and .png.",
)
for family in (cli_engine, cli_serve, cli_ui, cli_peers, cli_report):
    bench_app.registered_commands += family.commands.registered_commands


if __name__ == "__main__":
    bench_app()
