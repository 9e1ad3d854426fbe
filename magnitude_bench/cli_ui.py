"""Provides the `magnitude-bench` commands that measure the app and its long reliability run: ui,
ui-cpu, soak."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from magnitude_bench import options
from magnitude_bench.cli_common import DeviceOpt, ModelOpt, OutOpt, PanesOpt, finish, progress

commands = typer.Typer()


@commands.command()
def ui(
    panes: int = PanesOpt,
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
    finish(run_ui_bench(config, cfg, progress=progress), out, None)


@commands.command("ui-cpu")
def ui_cpu(
    panes: int = PanesOpt,
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
    from dataclasses import asdict

    from magnitude_bench.ui_cpu import CpuConfig, run_cpu_bench

    cfg = CpuConfig(panes=panes, step_hz=rate, duration_s=seconds, show_sequences=sequences,
                    profile=str(profile) if profile else None)
    results = run_cpu_bench(cfg, reps=reps)
    for r in results:
        print(r.summary())
    if reps > 1:
        print(f"median app_cores {statistics.median(r.app_cores for r in results):.3f}")
    if json_out is not None:
        json_out.write_text(json.dumps([asdict(r) for r in results], indent=1))


@commands.command()
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
    result = run_soak(cfg, chosen, progress=progress)
    finish(result, out, None)
    if result.data["failures"]:
        raise typer.Exit(1)
