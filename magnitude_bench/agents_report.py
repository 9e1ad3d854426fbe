"""Provides `bench agents`' accounting (the trace's minimum prompt tokens vs those evaluated), tables, targets and plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from magnitude_bench.agents_replay import CallKind, CallRecord, Replay
from magnitude_bench.agents_sides import SERVE_PROMPTS, SIDES
from magnitude_bench.common import BenchResult
from scheduler.stats import median, percentile, rnd

# The targets: serve ÷ llama-server's best configuration.
MAKESPAN_BURSTS, TTFT_P95_BURSTS, MAKESPAN_NO_BURSTS, EVAL_X_MIN = 0.6, 0.5, 1.0, 1.1

# The serve sides the targets are measured on: serve as launched, else serve with a KV stream per
# sequence (`--kv-streams`, how a user without subagents would launch it). Other serve variants
# (an attention path or speculation forced) are reported apart.
TARGET_SERVES = (SIDES["serve"].label, SIDES["serve+streams"].label)
# llama-server without -kvu (its default when -np is given) is outside the configurations
# (unified KV, with and without --cache-reuse and --cache-ram): reported beside them, not as "best".
STREAMS = "-no-kvu"


def target_serve(runs: list[dict]) -> dict | None:
    """The serve side the targets are measured on, among these runs or table rows (None: none)."""
    return next((r for name in TARGET_SERVES for r in runs if r["side"] == name), None)


@dataclass(frozen=True)
class Accounting:
    """Prompt tokens of a run: all of them, the minimum the trace needs (new tokens only: what no
    earlier call of the same context already evaluated), those the side evaluated, and those it
    evaluated beyond the minimum (its cache no longer held them: evicted, or never shared)."""

    prompt: int
    minimum: int
    evaluated: int
    reevaluated: int

    @property
    def eval_x_min(self) -> float | None:
        return self.evaluated / self.minimum if self.minimum else None


def minimum_new(call: CallRecord, extends: CallRecord | None) -> int:
    """What `call` must evaluate at least: its prompt less the context it extends (that call's
    prompt and reply; a reply cut at max_tokens ends on a token sampled but never evaluated)."""
    if extends is None:
        return call.prompt_tokens
    held = extends.prompt_tokens + extends.completion_tokens - (1 if extends.by_length else 0)
    return max(0, call.prompt_tokens - held)


def account(calls: list[CallRecord]) -> Accounting:
    by = {c.index: c for c in calls}
    ok = [c for c in calls if c.error is None]
    mins = {c.index: minimum_new(c, None if c.extends is None else by[c.extends]) for c in ok}
    return Accounting(prompt=sum(c.prompt_tokens for c in ok), minimum=sum(mins.values()),
                      evaluated=sum(c.evaluated for c in ok),
                      reevaluated=sum(max(0, c.evaluated - mins[c.index]) for c in ok))


def summary(replay: Replay) -> dict:
    """One run's row: makespan, TTFT of every call (agents' turns and subagents'), the accounting."""
    acc = account(replay.calls)
    ttfts = [c.ttft_s for c in replay.calls if c.ttft_s is not None]
    sub = [c.ttft_s for c in replay.calls if c.ttft_s is not None and c.kind is CallKind.SUBAGENT]
    return {"makespan_s": rnd(replay.makespan_s, 2), "calls": len(replay.calls),
            "ttft_p50_s": rnd(percentile(ttfts, 50), 3), "ttft_p95_s": rnd(percentile(ttfts, 95), 3),
            "subagent_ttft_p95_s": rnd(percentile(sub, 95), 3),
            "prompt_tokens": acc.prompt, "minimum": acc.minimum, "evaluated": acc.evaluated,
            "eval_x_min": rnd(acc.eval_x_min, 3), "reevaluated": acc.reevaluated,
            "generated": sum(c.completion_tokens for c in replay.calls),
            "kv_peak": max((u for _, u, _ in replay.kv), default=None),
            "errors": sum(c.error is not None for c in replay.calls)}


def tables(result: BenchResult, runs: list[dict]) -> None:
    """Medians per (trace, side); serve ÷ llama-server's best per repetition; the targets."""
    rows = []
    for bursts, side in dict.fromkeys((r["bursts"], r["side"]) for r in runs):
        every = [r for r in runs if r["bursts"] == bursts and r["side"] == side]
        # A run with a failed call did less work: its figures are not the trace's.
        at = [r for r in every if not r["errors"]] or every
        row = {"trace": _trace(bursts), "side": side, "reps": len(at)}
        for col in ("makespan_s", "ttft_p50_s", "ttft_p95_s", "subagent_ttft_p95_s", "prompt_tokens", "minimum",
                    "evaluated", "eval_x_min", "reevaluated", "generated"):
            row[col] = rnd(median(r[col] for r in at if r[col] is not None), 3)
        row["errors"] = sum(r["errors"] for r in every)
        row["others_cores_max"] = rnd(max(r["others_cores"] for r in every), 2)
        rows.append(row)
    result.tables["per side, median of the repetitions without a failed call"] = rows
    ratios, targets = [], []
    for bursts in dict.fromkeys(r["bursts"] for r in runs):
        got = _ratios(runs, bursts)
        if got:
            ratios.append({"trace": _trace(bursts), **got})
            targets += _targets(bursts, got)
    for trace in dict.fromkeys(r["trace"] for r in rows):
        r = target_serve([x for x in rows if x["trace"] == trace])
        if r is not None and r["eval_x_min"] is not None:
            targets.append({"target": f"{r['side']} prompt tokens evaluated ≤ {EVAL_X_MIN}x the minimum ({trace})",
                            "measured": r["eval_x_min"], "met": r["eval_x_min"] <= EVAL_X_MIN})
    if ratios:
        result.tables["serve ÷ llama-server's best configuration (median of per-repetition ratios)"] = ratios
    if targets:
        result.tables["the issue's targets"] = targets


def _trace(bursts: bool) -> str:
    return "with bursts" if bursts else "no bursts"


def _ratios(runs: list[dict], bursts: bool) -> dict | None:
    """Per repetition: serve's figure ÷ the best (lowest) any llama-server configuration had in that
    repetition; then the median over repetitions."""
    per: dict[str, list[float]] = {"makespan": [], "ttft_p95": [], "ttft_p50": [], "alike": [], "streams": []}
    best_side: list[str] = []
    served = ""
    for rep in sorted({r["rep"] for r in runs}):
        at = [r for r in runs if r["bursts"] == bursts and r["rep"] == rep and not r["errors"]]
        ours = target_serve(at)
        # The configurations: not the one sent serve's prompts (a like-for-like check),
        # nor one without unified KV (reported in a column of its own).
        theirs = [r for r in at if r["side"].startswith("llama-server") and SERVE_PROMPTS not in r["side"]
                  and STREAMS not in r["side"]]
        alike = next((r for r in at if SERVE_PROMPTS in r["side"]), None)
        streams = next((r for r in at if r["side"].startswith("llama-server") and STREAMS in r["side"]
                        and SERVE_PROMPTS not in r["side"]), None)
        if ours is not None:
            served = ours["side"]
            for key, other in (("alike", alike), ("streams", streams)):
                if other is not None:
                    per[key].append(ours["makespan_s"] / other["makespan_s"])
        if ours is None or not theirs:
            continue
        best = min(theirs, key=lambda r: r["makespan_s"])
        best_side.append(best["side"])
        per["makespan"].append(ours["makespan_s"] / best["makespan_s"])
        for q in ("ttft_p95", "ttft_p50"):
            lows = [r[f"{q}_s"] for r in theirs if r[f"{q}_s"]]
            if lows and ours[f"{q}_s"] is not None:
                per[q].append(ours[f"{q}_s"] / min(lows))
    extra = {**({f"makespan ÷ llama-server {SERVE_PROMPTS}": rnd(median(per["alike"]), 3)} if per["alike"] else {}),
             **({f"makespan ÷ llama-server {STREAMS}": rnd(median(per["streams"]), 3),
                 f"each repetition (÷ {STREAMS})": ", ".join(f"{x:.2f}" for x in per["streams"])}
                if per["streams"] else {})}
    if not per["makespan"]:
        return {"serve": served, **extra} if extra else None
    return {**({"serve": served} if served != "serve" else {}),
            "makespan ÷ best": rnd(median(per["makespan"]), 3),
            "ttft p95 ÷ best": rnd(median(per["ttft_p95"]), 3),
            "ttft p50 ÷ best": rnd(median(per["ttft_p50"]), 3),
            "each repetition (makespan)": ", ".join(f"{x:.2f}" for x in per["makespan"]),
            "best llama-server (by makespan)": ", ".join(dict.fromkeys(best_side)), **extra}


def _targets(bursts: bool, got: dict) -> list[dict]:
    if "makespan ÷ best" not in got:
        return []  # no configuration of the in this run
    serve = got.get("serve", "serve")
    if bursts:
        out = [{"target": f"with bursts: {serve} makespan ≤ {MAKESPAN_BURSTS}x llama-server's best",
                "measured": got["makespan ÷ best"], "met": got["makespan ÷ best"] <= MAKESPAN_BURSTS}]
        if got["ttft p95 ÷ best"] is not None:
            out.append({"target": f"with bursts: {serve} TTFT p95 ≤ {TTFT_P95_BURSTS}x llama-server's best",
                        "measured": got["ttft p95 ÷ best"], "met": got["ttft p95 ÷ best"] <= TTFT_P95_BURSTS})
        return out
    return [{"target": f"no bursts: {serve} makespan ≤ {MAKESPAN_NO_BURSTS}x llama-server's best",
             "measured": got["makespan ÷ best"], "met": got["makespan ÷ best"] <= MAKESPAN_NO_BURSTS}]


def plot_agents(result: BenchResult, path: Path) -> None:
    """KV cells in use over each side's first repetition, one panel per trace."""
    from magnitude_bench.plots import decorate, plt, save_figure

    runs = [r for r in result.data.get("runs", []) if r["rep"] == 1]
    traces = list(dict.fromkeys(r["bursts"] for r in runs)) or [True]
    fig, axes = plt.subplots(1, len(traces), figsize=(6.5 * len(traces), 4.2), squeeze=False)
    for ax, bursts in zip(axes[0], traces):
        for r in (r for r in runs if r["bursts"] == bursts):
            if r["kv"]:
                ax.plot([p[0] for p in r["kv"]], [p[1] for p in r["kv"]], label=r["side"], lw=1.2)
                ax.axvline(r["makespan_s"], ls=":", lw=0.6, color=ax.lines[-1].get_color())
        decorate(ax, "seconds since the first call", "cells (llama-server: its slots' cached prompts)",
                 f"KV cells in use, {_trace(bursts)} (dotted: makespan)", legend={"fontsize": 7} if ax.lines else None)
    save_figure(fig, path)
