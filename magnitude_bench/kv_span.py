"""Provides `bench kv-span`: what the span of a unified KV cache costs each decode row.

In llama.cpp's unified cache (`-kvu`, the layout the engine runs, and llama-server's with `-kvu`)
every row's attention runs over every cell up to the highest one in use, the other sequences'
cells masked out, so N sequences of P tokens each attend over about N x P cells. The same rows run
here three ways in `llama-batched-bench`, in alternating order: the unified cache with a prompt
per sequence (N x P cells), the unified cache with one prompt shared by every sequence (`-pps`:
about P cells, what forks of one parent see), and a cache stream per sequence (no `-kvu`: each
row over its own P cells, in n_ctx / N cells per sequence). Reported per layout: the cells in use,
the cells a decode row attends over, and the decode and prompt rates.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from magnitude_bench import peers
from magnitude_bench.common import BenchResult, not_quiet_notes
from magnitude_bench.harness import recorded, sweep
from scheduler.stats import rnd

# (name, unified, extra flags)
LAYOUTS: tuple[tuple[str, bool, list[str]], ...] = (
    ("unified, a prompt per sequence", True, []),
    ("unified, one prompt shared", True, ["-pps"]),
    ("a stream per sequence", False, []),
)


@dataclass(frozen=True)
class KvSpanConfig:
    prompt: int = 1000  # tokens per sequence (-npp)
    seqs: int = 5  # sequences decoding at once (-npl)
    gen: int = 24  # tokens each generates (-ntg)
    reps: int = 2
    threads: int = 1
    flash_attn: str = "on"  # -fa: the path the engine's probe picks deep in a shared pool here
    model: str | None = None


@recorded
def run_kv_span(cfg: KvSpanConfig, progress=lambda s: None) -> BenchResult:
    bindir = peers.required_tools("llama-batched-bench")
    model = peers.model_path(cfg.model)
    n_ctx = max(2048, cfg.seqs * (cfg.prompt + cfg.gen) + 256)

    def run(layout: tuple[str, bool, list[str]], rep: int) -> dict:
        name, unified, extra = layout
        progress(f"repetition {rep + 1} of {cfg.reps}: {name}")
        row = peers.batched_bench(bindir, model=model, seqs=[cfg.seqs], prompt=cfg.prompt, gen=cfg.gen,
                                  threads=cfg.threads, n_ctx=n_ctx, n_batch=2048, n_ubatch=512,
                                  dev=peers.device_args("CPU"), extra=["-fa", cfg.flash_attn, *extra],
                                  unified=unified)[cfg.seqs]
        return {"n_kv": row["n_kv"], "tg_tok_s": row["speed_tg"], "pp_tok_s": row["speed_pp"]}

    runs = sweep(LAYOUTS, cfg.reps, run, label=lambda layout: layout[0], progress=progress)
    for r in runs:
        r["layout"] = r.pop("config")
    res = BenchResult(name="kv-span", title="bench kv-span: decode rows over a unified KV cache's span",
                      config={"kv_span": asdict(cfg), "n_ctx": n_ctx})
    base = statistics.median(r["tg_tok_s"] for r in runs if r["layout"] == LAYOUTS[0][0])
    rows = []
    for name, unified, _ in LAYOUTS:
        mine = [r for r in runs if r["layout"] == name]
        tg = statistics.median(r["tg_tok_s"] for r in mine)
        # A unified cache's rows attend over every cell in use (llama-batched-bench's n_kv, all
        # sequences), a stream's over its own sequence's.
        rows.append({"layout": name, "reps": len(mine), "cells_in_use": mine[0]["n_kv"],
                     "cells_per_row": mine[0]["n_kv"] if unified else cfg.prompt + cfg.gen, "tg_tok_s": rnd(tg, 2),
                     "pp_tok_s": rnd(statistics.median(r["pp_tok_s"] for r in mine), 2),
                     "tg ÷ unified": rnd(tg / base, 3)})
    res.tables[f"{cfg.seqs} sequences of {cfg.prompt} prompt tokens decoding at once, "
               f"{cfg.threads} thread(s), -fa {cfg.flash_attn} (median of {cfg.reps})"] = rows
    res.repetitions = runs
    res.notes += [
        "cells_in_use: every sequence's cells at the end (llama-batched-bench's n_kv); cells_per_row: what a "
        "decode row's attention runs over at the end (the unified cache's span, or its own stream's cells; "
        "llama.cpp pads it to 256)",
        "tg_tok_s: generated tokens per second, all sequences together (llama-batched-bench's decode phase); "
        "pp_tok_s: prompt tokens per second",
        "a stream per sequence holds n_ctx / sequences cells each: a sequence cannot outgrow its share, and a "
        "fork into another stream copies the whole stream",
    ] + not_quiet_notes()
    return res
