"""Provides the renderers of `bench spec` results: the matrix (one row per task and width, every mode
against `off`), its targets, the `--control` runs and llama-server's own speculation."""

from __future__ import annotations

from magnitude_bench.report_format import Cell, md_table, source, table
from magnitude_bench.report_raw import Raw, Results

CPU = "engine on llama.cpp CPU"
SIM = "simulated "
PEER = "llama-server's own speculation"


def _cells(rows: list[dict]) -> dict[tuple[str, int], dict[str, dict]]:
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for r in rows:
        out.setdefault((r["task"], r["seqs"]), {})[r["mode"]] = r
    return out


def _ratios(r: dict | None) -> Cell | str:
    """While every sequence generates / per sequence / aggregate, ÷ `off` (older runs lack the first)."""
    if r is None:
        return "-"
    return Cell(r.get("x_off_full"), r.get("x_off_per_seq"), r.get("x_off_agg"))


def matrix(doc: dict) -> str:
    """One row per task and width: `off`'s rate, then every other mode ÷ `off`, then the simulated GPU."""
    raw = Raw(key="", file="", doc=doc, provenance={})
    cpu = _cells(table(raw, CPU))
    sim_rows = table(raw, SIM)
    sim = _cells(sim_rows)
    present = {r["mode"] for r in table(raw, CPU)}
    modes = [m for m in ("auto", "ngram", "draft", "off again") if m in present]
    sim_mode = next((m for m in ("auto", "draft") if any(r["mode"] == m for r in sim_rows)), None)
    head = ["task", "seqs", "`off` tok/s (agg)"]
    for m in modes:
        if m == "auto":
            head += ["`auto` ÷ `off`: all generate / per seq / agg", "`auto` acceptance, draft rows a step"]
        elif m == "ngram":
            head.append("forced `ngram` ÷ `off` (agg)")
        elif m == "draft":
            head += ["`draft` ÷ `off` (agg)", "`draft` acceptance"]
        else:
            head.append("`off again` ÷ `off`: all generate / per seq / agg")
    if sim_mode:
        head.append(f"simulated GPU `{sim_mode}` ÷ `off`: all generate / per seq / agg")
    rows = []
    for (task, seqs), by_mode in cpu.items():
        off = by_mode.get("off", {})
        row = [task, seqs, off.get("agg_tok_s")]
        for m in modes:
            r = by_mode.get(m)
            if m == "auto":
                row += [_ratios(r), Cell(r.get("acceptance"), r.get("draft_rows_per_step"), sep=", ") if r else "-"]
            elif m == "ngram":
                row.append(r.get("x_off_agg") if r else None)
            elif m == "draft":
                row += [r.get("x_off_agg") if r else None, r.get("acceptance") if r else None]
            else:
                row.append(_ratios(r))
        if sim_mode:
            row.append(_ratios(sim.get((task, seqs), {}).get(sim_mode)))
        rows.append(row)
    return md_table(head, rows)


def spec(results: Results, raw: Raw) -> str:
    return "\n\n".join([matrix(raw.doc), source(raw)])


# What each recorded target figure is, its bar and which way it must lie.
TARGETS = (
    ("auto_min_x_off", "T1: lowest `auto` ÷ `off` cell, while all generate and per sequence, CPU", 0.97, ">="),
    ("simulated_auto_min_x_off", "T1: the same on the simulated GPU", 0.97, ">="),
    ("auto_min_x_off_agg", "T1 read on the closed batch's aggregate (drain included), CPU", 0.97, ">="),
    ("simulated_auto_min_x_off_agg", "the same on the simulated GPU", 0.97, ">="),
    ("repetitive_1_seq_best_x_off", "T2: repetitive task, 1 sequence, CPU", 1.3, ">="),
)


def met(value: float | None, bar: float, way: str) -> bool | None:
    if value is None:
        return None
    return value >= bar if way == ">=" else value <= bar


def spec_targets(results: Results, raw: Raw) -> str:
    t = raw.doc["data"]["targets"]
    rows = [[what, t.get(key), f"{'≥' if way == '>=' else '≤'} {bar}", met(t.get(key), bar, way)]
            for key, what, bar, way in TARGETS if t.get(key) is not None]
    sim = t.get("simulated_repetitive_auto_x_off") or {}
    if sim:
        low = min(sim.values())
        rows.append([f"T3: simulated GPU, repetitive, `auto` ÷ `off` at {' / '.join(sim)} sequences",
                     Cell(*sim.values()), "≥ 2 at each", met(low, 2.0, ">=")])
    if t.get("control_x_off"):
        rows.append(["identical work: `off again` ÷ `off`, lowest and highest cell", Cell(*t["control_x_off"], sep=" – "),
                     "-", None])
    return md_table(["target (issue 13)", "measured", "bar", "met"], rows) + "\n\n" + source(raw)


def spec_control(results: Results, raw: Raw) -> str:
    out = []
    for run in raw.doc["runs"]:
        out += [f"`{run['command'].replace('magnitude-tui bench', 'magnitude-bench')}`:", matrix(run)]
    return "\n\n".join(out + [source(raw)])


def spec_peer(results: Results, raw: Raw) -> str:
    rows = [[r["task"], r["seqs"], r["spec_type"], r["agg_tok_cpu_s"], r["x_none_agg"], r["x_none_per_seq"],
             r["acceptance"], r["tokens"]] for r in table(raw, PEER) if r["spec_type"] != "none"]
    return md_table(["task", "seqs", "llama-server", "tok/s a CPU second", "÷ `none` (agg)", "÷ `none` (per seq)",
                     "acceptance", "tokens"], rows) + "\n\n" + source(raw)
