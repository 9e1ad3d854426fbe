"""Provides what the benchmark pages' renderers share: figures as recorded, Markdown tables, and
where each section's figures come from (file, date, machine, load, command)."""

from __future__ import annotations

from magnitude_bench.report_raw import Raw


def fmt(v) -> str:
    """A recorded value as written in the JSON (no rounding: a figure on the page is the file's)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        return format(v, ",")
    return str(v).replace("|", "\\|")


def rows_table(rows: list[dict], cols: list[str] | None = None) -> str:
    """`md_table` of dict rows: the columns `cols` (default: the first row's keys), a missing cell "-"."""
    cols = cols or list(rows[0].keys())
    return md_table(cols, [[r.get(c) for c in cols] for r in rows])


def md_table(headers: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(fmt(c) if not isinstance(c, Cell) else c.text for c in r) + " |" for r in rows]
    return "\n".join(out)


class Cell:
    """Already formatted text for a table cell (several figures in one cell)."""

    def __init__(self, *values, sep: str = " / ") -> None:
        self.text = sep.join(fmt(v) for v in values)


def table(raw: Raw, prefix: str) -> list[dict]:
    """The rows of the result's table whose title starts with `prefix`."""
    for title, rows in raw.doc.get("tables", {}).items():
        if title.startswith(prefix):
            return rows
    raise KeyError(f"{raw.file}: no table titled {prefix!r}...")


def slots(raw: Raw) -> int:
    """An agents run's sequence slots: llama-server's -np and the engine's sequences (its setups agree)."""
    return raw.doc["config"]["setups"][0]["parallel"]


# `bench agents --k-max` at which no tool result of the repository's traces is cut (their K is 100-3,000).
FULL_K = 3000


def tool_results(raw: Raw) -> str:
    """How an agents run's tool results were sent: whole, or cut to `--k-max` tokens."""
    k = raw.doc["config"]["agents"]["k_max"]
    return "whole tool results" if k >= FULL_K else f"tool results cut to {k} tokens"


def kv_cells(raw: Raw) -> int:
    """An agents run's KV cells, every side's (`--ctx`)."""
    return raw.doc["config"]["setups"][0]["n_ctx"]


def machine(raw: Raw) -> str:
    m = raw.doc.get("machine") or {}
    where = raw.provenance.get("machine")
    if where is None:
        cpu = m.get("cpu", "?")
        cores = m.get("cpu_count") or m.get("cores")
        where = f"{cpu}, {cores} cores" if cores else cpu
    config = raw.doc.get("config") or {}
    specs = [config.get("backend"), *(config.get("backends") or [])]
    kinds = [b.get("kind", "") if isinstance(b, dict) else str(b or "") for b in specs]
    simulated = [k for k in kinds if k.startswith("simulated:")]
    if simulated and len(simulated) == len([k for k in kinds if k]):
        where = f"{', '.join(simulated)} (virtual clock) on {where}"
    return where


def load(raw: Raw) -> str:
    """The load the result records, said as what it is: most benches build their machine record
    after the run, so a single reading is the load at the end, not at the start."""
    if raw.run.get("load_avg_before") and raw.run.get("load_avg_after"):
        return f"load (1 min) {fmt(raw.run['load_avg_before'][0])} before, {fmt(raw.run['load_avg_after'][0])} after"
    runs = (raw.doc.get("data") or {}).get("runs")
    if isinstance(runs, list) and runs and "load_before" in runs[0]:
        before = [r["load_before"][0] for r in runs]
        after = [r["load_after"][0] for r in runs]
        return f"load (1 min) before runs {fmt(min(before))}–{fmt(max(before))}, after {fmt(min(after))}–{fmt(max(after))}"
    m = raw.doc.get("machine") or {}
    first, end = m.get("load_avg_1_5_15"), m.get("load_avg_at_end")
    if end and first and first != end:
        return f"load (1 min) {fmt(first[0])} at the first reading, {fmt(end[0])} at the end"
    if end:
        return f"load (1 min) {fmt(end[0])} at the end (no reading before the run)"
    if m.get("loadavg_at_write"):
        return f"load (1 min) {fmt(m['loadavg_at_write'][0])} when written"
    return "load not recorded"


def source(*raws: Raw) -> str:
    """Where a section's figures come from: file, date, machine, load, command."""
    lines = []
    for r in raws:
        note = f"; {r.provenance['note']}" if r.provenance.get("note") else ""
        git = f"; code {r.run['git']}" if r.run.get("git") else ""
        lines.append(f"- `docs/benchmarks/{r.file}`: {r.date}; {machine(r)}; {load(r)}{git}{note}; `{r.command}`")
    return "Raw results:\n\n" + "\n".join(lines)


def plot(folder, raw: Raw) -> list[str]:
    """The Markdown image of a result's plot, when its PNG sits beside the JSON."""
    png = folder / (raw.file[:-len(".json")] + ".png")
    return [f"![{raw.key}](benchmarks/{png.name})", ""] if png.exists() else []
