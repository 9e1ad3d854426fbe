"""Provides the soak's two timed scenarios: CPU contention (14) and UI endurance (15). Their
targets are figures, not invariants: a miss is shown in the row, not counted as a failure, since
on a shared machine it may be the neighbours'. What is counted: a request that errs, a key the app
never shows, a reply that does not arrive whole."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from magnitude_tui.reliability.config import SoakConfig, soak_row


def contention(cfg: SoakConfig, progress: Callable[[str], None]) -> tuple[dict, list[str]]:
    from magnitude_bench.contention import KEEP_PEER, KEEP_QUIET, ContentionConfig, run_contention

    t0 = time.monotonic()
    try:
        result = run_contention(ContentionConfig(reps=cfg.contention_reps, model=cfg.model), progress)
    except RuntimeError as e:
        return soak_row("CPU contention", f"{time.monotonic() - t0:.0f} s", 1, "-", "-"), [str(e)]
    rows = result.tables["contention"]
    parts, met = [], True
    for r in rows:
        vs_quiet, vs_peer = r.get("engine vs quiet"), r.get("engine vs best peer")
        parts.append(f"{r['load']}: {r['engine tok/s']} tok/s on {r['engine threads']} threads, "
                     f"{vs_quiet}x quiet, {vs_peer}x best peer ({r['best peer']}), loadavg {r['loadavg 1m']}")
        if r["load"] != "quiet":
            met = met and (vs_quiet or 0) >= KEEP_QUIET and (vs_peer or 0) >= KEEP_PEER
    return soak_row("CPU contention", f"{len(rows)} loads x {cfg.contention_reps} reps, {time.monotonic() - t0:.0f} s",
                    0, "-", "-", contention="; ".join(parts),
                    targets_met="yes" if met else "no"), []


def ui_endurance(cfg: SoakConfig, progress: Callable[[str], None]) -> tuple[dict, list[str]]:
    from magnitude_bench.ui_cpu import CpuConfig, run_cpu
    from magnitude_bench.ui_endurance import EnduranceConfig, run_endurance

    progress(f"  {cfg.ui_flood:,} tokens into one pane while 7 stream, 50 resizes")
    endured = asyncio.run(run_endurance(EnduranceConfig(flood=cfg.ui_flood)))
    progress(f"  {endured.summary()}")
    # The same machine a moment later, 8 panes streaming and nothing else: what the flood adds.
    base = asyncio.run(run_cpu(CpuConfig(duration_s=15.0, key_interval_s=0.1)))
    progress(f"  baseline: {base.summary()}")
    # And 8 empty panes resized as often, a key typed after each: what a resize costs the app
    # with nothing in its panes (the floor under the keys typed right after a resize).
    floor = asyncio.run(run_endurance(EnduranceConfig(stream=False, resizes=20)))
    progress(f"  floor: {floor.summary()}")
    failures = []
    if endured.keys_missed:
        failures.append(f"{endured.keys_missed} of {len(endured.keys)} keys not on screen within 2 s")
    if endured.tokens < cfg.ui_flood:
        failures.append(f"only {endured.tokens} of {cfg.ui_flood} tokens arrived")
    keys = endured.keys_where()
    ratio = (keys.p95_ms / base.key_p95_ms) if keys.p95_ms and base.key_p95_ms else None
    after, away, empty = endured.keys_where(True), endured.keys_where(False), floor.keys_where(True)
    return soak_row(
        "UI endurance: 1 flooded pane, 7 streaming, resizes", f"{endured.tokens:,} tokens, {endured.resizes} resizes, "
        f"{endured.wall_s:.0f} s", len(failures), "-", "-",
        rss_mib=f"{endured.rss_start_mb:.0f} -> {endured.rss_mid_mb:.0f} -> {endured.rss_end_mb:.0f}",
        key_p95_ms=f"{keys.p95_ms:.0f} (p50 {keys.p50_ms:.0f}; 8 panes streaming alone: "
                   f"p95 {base.key_p95_ms:.0f}, p50 {base.key_p50_ms:.0f})" if keys.p95_ms and base.key_p95_ms else "-",
        key_p95_vs_baseline=round(ratio, 2) if ratio else None,
        keys_after_a_resize_ms=_p50_max(after) + f" (8 empty panes: {_p50_max(empty)})",
        other_keys_p95_ms=_ms(away.p95_ms),
        resize_frame_ms=_frames(endured) + f" (8 empty panes: {_frames(floor)})",
        settled_s=round(endured.settle_s, 1)), failures


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _p50_max(figures) -> str:
    return f"p50 {_ms(figures.p50_ms)}, max {_ms(figures.max_ms)}"


def _frames(result) -> str:
    p50, top = result.resize_frames()
    return f"p50 {_ms(p50)}, max {_ms(top)}"


def ui_long_session(cfg: SoakConfig, progress: Callable[[str], None]) -> tuple[dict, list[str]]:
    """The app after a long session: 8 panes with 20 finished turns each stream while keys are
    typed and the terminal is resized (a transcript keeps only its latest messages as widgets)."""
    from magnitude_bench.ui_endurance import EnduranceConfig, run_endurance

    progress("  8 panes with 20 turns of history each, streaming, 5 resizes")
    r = asyncio.run(run_endurance(EnduranceConfig(flood=30_000, resizes=5, history=20)))
    progress(f"  {r.summary()}")
    failures = [f"{r.keys_missed} of {len(r.keys)} keys not on screen within 2 s"] if r.keys_missed else []
    return soak_row(
        "UI after a long session: 8 panes x 20 turns, streaming, resizes",
        f"{r.tokens:,} tokens, {r.resizes} resizes, {r.wall_s:.0f} s", len(failures), "-", "-",
        rss_mib=f"{r.rss_start_mb:.0f} -> {r.rss_mid_mb:.0f} -> {r.rss_end_mb:.0f}", widgets=r.widgets,
        key_p95_ms=f"{_ms(r.keys_where().p95_ms)} (p50 {_ms(r.keys_where().p50_ms)})",
        keys_after_a_resize_ms=_p50_max(r.keys_where(True)), other_keys_p95_ms=_ms(r.keys_where(False).p95_ms),
        resize_frame_ms=_frames(r)), failures
