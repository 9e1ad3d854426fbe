"""Provides the PNG plots of the benchmarks (matplotlib, headless)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from magnitude_bench.common import BenchResult  # noqa: E402


def decorate(ax, xlabel: str, ylabel: str, title: str | None = None, *, log2: bool = False, which: str = "major",
             legend: dict | None = None) -> None:
    """An axis's labels, title, light grid, optional log2 x scale and legend (its keyword arguments)."""
    if log2:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which=which, alpha=0.3)
    if legend is not None:
        ax.legend(**legend)


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_admit(result: BenchResult, path: Path) -> None:
    """Per backend: running tok/s and newcomer TTFT against the chunk size (log x), targets marked,
    and the trade-off itself: keep against TTFT / prefill-first, with the additive-cost bound."""
    backends = list(result.data.items())
    fig, axes = plt.subplots(len(backends), 3, figsize=(17, 4.2 * len(backends)), squeeze=False)
    for (label, s), (ax_rate, ax_ttft, ax_trade) in zip(backends, axes):
        _trade_off(ax_trade, label, s)
        rows = s["rows"]
        fixed = sorted((r for r in rows if r["policy"].startswith("fixed:")), key=lambda r: r["chunk"] or 0)
        targets = [r for r in rows if r["policy"].startswith("target:")]
        pf = next((r for r in rows if r["policy"] == "prefill-first"), None)
        base = s["undisturbed_tok_s"]
        for ax, key, unit in ((ax_rate, "running_tok_s", "tok/s per running sequence"),
                              (ax_ttft, "ttft_s", "newcomer TTFT (s)")):
            ax.plot([r["chunk"] for r in fixed], [r[key] for r in fixed], "o-", color="tab:blue",
                    label="fixed:N (measured)")
            for r in fixed:
                ax.annotate(r["policy"].split(":")[1], (r["chunk"], r[key]), textcoords="offset points",
                            xytext=(0, 6), ha="center", fontsize=7, color="tab:blue")
            if pf:
                ax.plot([pf["chunk"]], [pf[key]], "*", ms=14, color="tab:gray", label="prefill-first")
            ax.plot([r["chunk"] for r in targets], [r[key] for r in targets], "D", ms=8, color="tab:red",
                    label="target:MS (measured)")
            for i, r in enumerate(targets):  # staggered: targets floored at one chunk share a point
                ax.annotate(r["policy"], (r["chunk"], r[key]), textcoords="offset points",
                            xytext=(8, -12 - 10 * i), fontsize=8, color="tab:red")
            _model_curve(ax, s, key)
            decorate(ax, "prompt rows per step (chunk), log scale", unit, log2=True, which="both")
        ax_rate.axhline(base, color="tab:green", lw=1, ls=":", label=f"undisturbed {base:.1f}")
        ax_rate.axhline(base / 2, color="tab:green", lw=1, ls="--", label="half of undisturbed")
        if pf:
            ax_ttft.axhline(pf["ttft_s"], color="tab:gray", lw=1, ls=":", label="prefill-first TTFT")
            ax_ttft.axhline(1.6 * pf["ttft_s"], color="tab:gray", lw=1, ls="--", label="1.6x prefill-first")
        ax_rate.set_title(f"{label}: running sequences during the admission", fontsize=10)
        ax_ttft.set_title(f"{label}: newcomer ({s['newcomer_tokens']:,} tokens) time to first token", fontsize=10)
        ax_rate.legend(fontsize=7)
        ax_ttft.legend(fontsize=7)
    save_figure(fig, path)


def _trade_off(ax, label: str, s: dict) -> None:
    """keep (running tok/s over undisturbed) against the newcomer's TTFT over prefill-first's; the
    curve 1 / (1 - keep) is the best any policy can do when a step costs the sum of its parts."""
    rows = [r for r in s["rows"] if r.get("ttft_x_pf") is not None and r["policy"] != "prefill-first"]
    if not rows:
        ax.set_visible(False)
        return
    ks = [i / 100 for i in range(0, 90)]
    ax.plot([1 / (1 - k) for k in ks], ks, "-", color="black", lw=0.8, alpha=0.6,
            label="bound: TTFT = prefill-first / (1 - keep)")
    ax.add_patch(plt.Rectangle((0.9, 0.5), 0.7, 0.6, color="tab:green", alpha=0.12,
                               label="asked: keep >= 0.5, TTFT <= 1.6x"))
    for kind, style, color in (("fixed:", "o", "tab:blue"), ("target:", "D", "tab:red")):
        pts = [r for r in rows if r["policy"].startswith(kind)]
        ax.plot([r["ttft_x_pf"] for r in pts], [r["keep"] for r in pts], style, color=color,
                label=f"{kind}N" if kind == "fixed:" else "target:MS")
        for r in pts:
            ax.annotate(r["policy"].split(":")[1], (r["ttft_x_pf"], r["keep"]), textcoords="offset points",
                        xytext=(5, 3), fontsize=7, color=color)
    decorate(ax, "newcomer TTFT / prefill-first TTFT, log scale", "keep: running tok/s / undisturbed",
             f"{label}: the trade-off", log2=True, which="both", legend={"fontsize": 7})
    ax.set_xlim(0.8, max(4.0, max(r["ttft_x_pf"] for r in rows) * 1.1))
    ax.set_ylim(0, 1.05)


def _model_curve(ax, s: dict, key: str) -> None:
    """The additive cost model for a fixed chunk C: 1/(decode step + C/rate), ceil(L/C) steps."""
    rate, step = s.get("prefill_rate_tok_s"), s["undisturbed_step_ms"] / 1000.0
    if not rate:
        return
    n = s["newcomer_tokens"]
    cs = [2 ** (i / 4) for i in range(16, 4 * 11 + 1)]
    if key == "running_tok_s":
        ys = [1.0 / (step + c / rate) for c in cs]
    else:
        ys = [math.ceil(n / c) * step + n / rate for c in cs]
    ax.plot(cs, ys, "--", color="black", lw=0.8, alpha=0.6, label="cost model")


def plot_prefill_curve(result: BenchResult, path: Path) -> None:
    """Prefill tok/s against chunk size (with and without decode rows) and decode step vs sequences."""
    d = result.data
    occ = d.get("occupancy") or []
    fig, axes = plt.subplots(1, 3 if occ else 2, figsize=(17 if occ else 12, 4.5))
    ax_p, ax_d = axes[0], axes[1]
    for mode, style in (("alone", "o-"), ("with_decode", "s-")):
        pts = [r for r in d["prefill"] if r["mode"] == mode]
        if not pts:
            continue
        label = "prompt rows alone" if mode == "alone" else f"beside {d['n_decode']} decode rows"
        ax_p.plot([r["chunk"] for r in pts], [r["prefill_tok_s"] for r in pts], style, label=f"{label} (measured)")
        ax_p.plot([r["chunk"] for r in pts], [r["model_prefill_tok_s"] for r in pts], "--", lw=0.8,
                  color=ax_p.lines[-1].get_color(), label=f"{label} (fitted model)")
    decorate(ax_p, "prompt rows in the step (chunk), log scale", "prefill tok/s", "prefill rate against chunk size",
             log2=True, which="both", legend={"fontsize": 7})
    dec = d["decode"]
    ax_d.plot([r["seqs"] for r in dec], [r["step_ms"] for r in dec], "o-", label="decode step (measured)")
    ax_d.plot([r["seqs"] for r in dec], [r["model_step_ms"] for r in dec], "--", color="black", lw=0.8,
              label="fitted model")
    ax2 = ax_d.twinx()
    ax2.plot([r["seqs"] for r in dec], [r["agg_tok_s"] for r in dec], "^:", color="tab:green", label="aggregate tok/s")
    ax2.set_ylabel("aggregate decode tok/s", color="tab:green")
    decorate(ax_d, "generating sequences (decode rows per step)", "step time (ms)",
             "decode step time against batch width", legend={"fontsize": 7, "loc": "upper left"})
    ax2.legend(fontsize=7, loc="lower right")
    if occ:
        ax_o = axes[2]
        xs = [r["prompt_cells"] for r in occ]
        ax_o.plot(xs, [r["decode_step_ms"] for r in occ], "o-", color="tab:purple",
                  label=f"{occ[0]['decode_rows']} decode rows")
        ax_o.plot(xs, [r["with_chunk16_ms"] for r in occ], "s-", color="tab:orange",
                  label="+ 16 prompt rows continuing the prompt")
        decorate(ax_o, "cells a long prompt already holds in the (unified) KV cache", "step time (ms)",
                 "a long prompt in the cache makes every step dearer", legend={"fontsize": 7})
        ax_o.set_ylim(bottom=0)
    fig.suptitle(d.get("label", ""), fontsize=10)
    save_figure(fig, path)


def plot_throughput(result: BenchResult, path: Path) -> None:
    """Aggregate generated tok/s against concurrent sequences, one line per peer."""
    rows = result.data["medians"]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for peer in dict.fromkeys(r["peer"] for r in rows):
        pts = sorted((r for r in rows if r["peer"] == peer and r["tok_s"]), key=lambda r: r["seqs"])
        ax.plot([r["seqs"] for r in pts], [r["tok_s"] for r in pts], "o-", label=peer)
    decorate(ax, "concurrent sequences", "generated tok/s (all sequences, end to end, median)",
             result.data.get("label", "throughput"), log2=True, which="both", legend={"fontsize": 8})
    ax.set_xticks([1, 2, 4, 8, 16], ["1", "2", "4", "8", "16"])
    save_figure(fig, path)


def plot_fork(result: BenchResult, path: Path) -> None:
    """TTFT of each subagent, forked vs cold, in the order they reached their first token."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, color in (("forked", "tab:green"), ("cold", "tab:red")):
        ttfts = sorted(result.data["ttft_s"].get(mode, []))
        ax.plot(range(1, len(ttfts) + 1), ttfts, "o-", color=color, label=mode)
    decorate(ax, "subagent (sorted by TTFT)", "TTFT (s)", result.data.get("label", "fork"), legend={})
    save_figure(fig, path)


def plot_serve(result: BenchResult, path: Path) -> None:
    """Aggregate tok/s by concurrent clients (serve vs llama-server), and the person's TTFT with
    and without priority classes beside the same turn on an idle engine."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    rows = result.tables.get("concurrent clients", [])
    for label, prefix, color in (("serve (this engine)", "serve", "tab:blue"),
                                 ("llama-server -np N", "llama-server", "tab:orange")):
        pts = sorted((r["clients"], r["agg_tok_s"]) for r in rows if r["peer"].startswith(prefix))
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=color, label=label)
    decorate(ax1, "concurrent HTTP clients", "aggregate generated tok/s")
    if rows:  # --parts without clients: an empty panel, no legend to draw
        ax1.legend()
    prio = result.tables.get("a person's turn behind agents", [])
    if prio:
        labels = ["idle engine"] + [r["mode"] for r in prio]
        values = [prio[0]["idle_ttft_ms"] / 1000.0] + [r["person_ttft_ms"] / 1000.0 for r in prio]
        ax2.bar(range(len(values)), values, color=["tab:gray", "tab:green", "tab:red"][:len(values)])
        ax2.set_xticks(range(len(values)), [label.split(" (")[0] for label in labels], fontsize=8)
        ax2.set_ylabel("the person's TTFT (s)")
        ax2.set_title("a person's 50-token turn behind agents", fontsize=10)
    save_figure(fig, path)


def plot_spec(result: BenchResult, path: Path) -> None:
    """Each mode's tok/s while every sequence generates ÷ off's, by width (auto's closed-batch
    aggregate, drain included, dotted): the real model (top) and the simulated GPU replaying its
    acceptance (bottom), one column per task; llama-server's n-gram ÷ its own none (aggregate)."""
    tables = list(result.tables.items())
    real = next((rows for title, rows in tables if title.startswith("engine on")), [])
    sim = next((rows for title, rows in tables if title.startswith("simulated")), [])
    peer = next((rows for title, rows in tables if title.startswith("llama-server")), [])
    tasks = list(dict.fromkeys(r["task"] for r in real))
    fig, axes = plt.subplots(2, max(1, len(tasks)), figsize=(4.2 * max(1, len(tasks)), 7), squeeze=False)
    colors = {"off": "tab:gray", "ngram": "tab:blue", "auto": "tab:green", "draft": "tab:purple",
              "off again": "tab:olive"}
    for row, (label, rows) in enumerate((("real model", real), ("simulated GPU", sim))):
        for col, task in enumerate(tasks):
            ax = axes[row][col]
            for mode, color in colors.items():
                for ratio, style, name in (("x_off_full", "o-", mode), ("x_off_agg", ":", f"{mode} aggregate")):
                    if ratio == "x_off_agg" and mode != "auto":
                        continue
                    pts = sorted((r["seqs"], r.get(ratio)) for r in rows
                                 if r["task"] == task and r["mode"] == mode and r.get(ratio) is not None)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=name)
            if row == 0:
                pts = sorted((r["seqs"], r["x_none_agg"]) for r in peer
                             if r.get("task") == task and r.get("spec_type") == "ngram-simple" and r.get("x_none_agg"))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "s--", color="tab:orange",
                            label="llama-server ngram")
            ax.axhline(1.0, color="black", lw=0.8)
            ax.axhline(0.97, color="tab:red", lw=0.6, ls=":")
            decorate(ax, "sequences", "tok/s while all generate ÷ off", f"{label}: {task}", log2=True,
                     legend={"fontsize": 7} if col == 0 else None)
    save_figure(fig, path)
