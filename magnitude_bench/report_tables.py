"""Provides the renderers of the benchmark pages' generated sections: one per kind of raw result,
each turning committed JSON into Markdown with every figure as the JSON records it."""

from __future__ import annotations

from typing import Callable

from magnitude_bench.agents_report import target_serve
from magnitude_bench.report_format import (
    Cell,
    fmt,
    kv_cells,
    md_table,
    plot,
    rows_table,
    slots,
    source,
    table,
    tool_results,
)
from magnitude_bench.report_raw import Raw, Results
from magnitude_bench.report_spec import spec, spec_control, spec_peer, spec_targets
from magnitude_bench.report_summary import summary

# ---- per kind ------------------------------------------------------------------------------------

def tables(results: Results, *raws: Raw) -> str:
    """Any BenchResult: every table as recorded, then its notes."""
    out = []
    for raw in raws:
        for title, rows in raw.doc.get("tables", {}).items():
            if rows:
                out += [f"*{title}*", "", rows_table(rows), ""]
        out += [f"- {n}" for n in raw.doc.get("notes", [])]
        out.append("")
        out += plot(results.folder, raw)
    return "\n".join(out + [source(*raws)])


def resume(results: Results, raw: Raw) -> str:
    ttft = table(raw, "time to first token")
    save = table(raw, "the saved state")[0]
    rows = [[r["mode"], r["runs"], r["ttft_p50_ms"], r["restore_ms"] or None, r["ttft_incl_restore_ms"],
             Cell(r["cached_tokens"], r["prompt_tokens"]), r["x_of_cold"]] for r in ttft]
    state = [[save["history_tokens"], save["state_mb"], save["bytes_per_token"], save["copy_from_kv_ms"],
              save["write_file_ms"], save["quit_total_ms"]]]
    return "\n\n".join([
        md_table(["mode", "runs", "TTFT p50 ms", "restore ms", "TTFT incl. restore ms", "cached / prompt tokens",
                  "÷ cold"], rows),
        md_table(["history tokens", "state MB", "bytes a token", "copy out of the KV ms", "write ms (background)",
                  "shutdown at quit ms"], state),
        source(raw)])


def person(results: Results, *raws: Raw) -> str:
    rows = []
    for raw in raws:
        profile = raw.doc["config"]["backend"]["kind"]
        for r in table(raw, "the person's time"):
            rows.append([profile, r["mode"], r["ttft_s"], r["x_alone"], r["agent_max_gap_s"], r["agent_tok_s"]])
    return "\n\n".join([md_table(["backend", "mode", "TTFT s", "÷ alone", "agents' longest gap s",
                                  "agent tok/s meanwhile"], rows), source(*raws)])


def structured(results: Results, raw: Raw) -> str:
    cols = ["engine", "seqs", "free tok/s", "json_schema tok/s", "json_schema ÷ free", "decode free", "decode json",
            "decode json ÷ free", "grammar share", "tokens/reply free", "tokens/reply json", "valid json",
            "others_cores_max"]
    return "\n\n".join([rows_table(table(raw, "aggregate tok/s"), cols), "This engine ÷ llama-server at 8 sequences:",
                        rows_table(table(raw, "this engine ÷ llama-server")), source(raw)])


def agents(results: Results, *raws: Raw) -> str:
    cols = ["side", "reps", "makespan_s", "ttft_p50_s", "ttft_p95_s", "subagent_ttft_p95_s", "evaluated", "minimum",
            "reevaluated", "generated", "errors", "others_cores_max"]
    out = []
    for raw in raws:
        a = raw.doc["config"]["agents"]
        out.append(f"*{a['agents']} agents × {a['turns']} turns, {tool_results(raw)}, "
                   f"{table(raw, 'per side')[0]['trace']}, {slots(raw)} sequence slots and {fmt(kv_cells(raw))} KV "
                   "cells each side"
                   f"{', every reply run to its max_tokens' if a.get('exact_replies') else ''}* (`{raw.file}`):")
        out.append(rows_table(table(raw, "per side"), cols))
        if target_serve(table(raw, "per side")) is None:
            out.append("No serve side the targets are measured on in this run: no ratio and no target.")
        else:
            ratio = table(raw, "serve ÷ llama-server")
            rcols = [c for c in ratio[0] if c != "trace"]
            out.append("serve ÷ llama-server's best configuration (median of per-repetition ratios):")
            out.append(md_table(rcols, [[r[c] for c in rcols] for r in ratio]))
            out.append(md_table(["target", "measured", "met"],
                                [[t["target"], t["measured"], t["met"]] for t in table(raw, "the issue's targets")]))
        out += [ln for ln in plot(results.folder, raw) if ln]
    return "\n\n".join(out + [source(*raws)])


def probe(results: Results, raw: Raw) -> str:
    t = raw.doc["timings_ms"]
    steps = list(t["flash_on"].keys())
    rows = [[s, t["flash_on"][s], t["flash_off"][s]] for s in steps]
    return "\n\n".join([f"{raw.doc['what']}. Verdict: {raw.doc['verdict']}.",
                        md_table(["step (ms)", "flash on", "flash off (dense)"], rows), source(raw)])


def callgrind(results: Results, raw: Raw) -> str:
    peer = next(r for r in raw.doc["results"] if r["side"] == "bench")
    rows = [[r["side"], r["flash"], r["step_ir_median"], Cell(*r["step_irs"], sep=", "), r["prefill_ir"],
             round(r["step_ir_median"] / peer["step_ir_median"], 5)] for r in raw.doc["results"]]
    return "\n\n".join([f"Unit: {raw.doc['unit']}.",
                        md_table(["side", "flash", "Ir per 8-row step (median)", "each step", "Ir of the prompt batch",
                                  "step ÷ llama-batched-bench"], rows),
                        "\n".join(f"- {n}" for n in raw.doc.get("notes", [])), source(raw)])


RENDERERS: dict[str, Callable[..., str]] = {
    "tables": tables, "resume": resume, "person": person, "structured": structured, "agents": agents,
    "probe": probe, "callgrind": callgrind, "spec": spec, "spec-control": spec_control,
    "spec-peer": spec_peer, "spec-targets": spec_targets, "summary": summary}
