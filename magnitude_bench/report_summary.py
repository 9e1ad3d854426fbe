"""Provides the summary table that opens docs/BENCHMARKS.md: each headline figure, read from its raw
result, beside its peer, its target and whether the target is met."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Callable

from magnitude_bench.agents_report import target_serve
from magnitude_bench.report_format import Cell, fmt, kv_cells, machine, md_table, slots, table, tool_results
from magnitude_bench.report_raw import Raw, Results
from magnitude_bench.report_spec import CPU, SIM, met
from scheduler.stats import rnd


@dataclass(frozen=True)
class Headline:
    """One row: what is compared, this engine's figure, the peer's, the ratio and the target."""

    what: str
    engine: object
    peer: object
    ratio: object
    target: str
    met: bool | None
    raw: Raw
    derived: str = ""  # how the ratio is computed from the rows, where the result records none


def _row(rows: list[dict], **match) -> dict:
    return next(r for r in rows if all(r.get(k) == v for k, v in match.items()))


def resume(results: Results) -> list[Headline]:
    raw = results.get("resume")
    rows = table(raw, "time to first token")
    warm, cold = _row(rows, mode="warm"), _row(rows, mode="cold")
    return [Headline("First reply after `--resume` (TTFT, restore included), 2,130-token conversation",
                     f"warm {fmt(warm['ttft_incl_restore_ms'])} ms", f"cold {fmt(cold['ttft_incl_restore_ms'])} ms",
                     warm["x_of_cold"], "≤ 0.2", met(warm["x_of_cold"], 0.2, "<="), raw)]


def spec(results: Results) -> list[Headline]:
    raw = results.get("spec-reps3")
    t = raw.doc["data"]["targets"]
    cpu, sim = table(raw, CPU), table(raw, SIM)
    auto1, off1 = _row(cpu, task="repetitive", seqs=1, mode="auto"), _row(cpu, task="repetitive", seqs=1, mode="off")
    s = t["simulated_repetitive_auto_x_off"]
    sim_auto = [_row(sim, task="repetitive", seqs=int(n), mode="auto")["agg_tok_s"] for n in s]
    sim_off = [_row(sim, task="repetitive", seqs=int(n), mode="off")["agg_tok_s"] for n in s]
    return [
        Headline("Speculation (`auto`), repetitive task, 1 sequence, CPU seconds (T2)",
                 f"`auto` {fmt(auto1['agg_tok_s'])} tok/s", f"`off` {fmt(off1['agg_tok_s'])} tok/s",
                 t["repetitive_1_seq_best_x_off"], "≥ 1.3", met(t["repetitive_1_seq_best_x_off"], 1.3, ">="), raw),
        Headline(f"Speculation (`auto`) on the simulated GPU, repetitive, {' / '.join(s)} sequences (T3)",
                 Cell(*sim_auto), Cell(*sim_off), Cell(*s.values()), "≥ 2 at each", met(min(s.values()), 2.0, ">="),
                 raw),
        Headline("Speculation (`auto`) never loses: lowest cell of 3 tasks × 5 widths, CPU seconds (T1)",
                 "`auto`", "`off`, same task and width", t["auto_min_x_off"], "≥ 0.97",
                 met(t["auto_min_x_off"], 0.97, ">="), raw),
        Headline("The same on the simulated GPU (T1)", "`auto`", "`off`", t["simulated_auto_min_x_off"], "≥ 0.97",
                 met(t["simulated_auto_min_x_off"], 0.97, ">="), raw),
    ]


def person(results: Results) -> list[Headline]:
    out = []
    for key in ("person-cpu2core", "person-cpu2core-deep"):
        raw = results.get(key)
        rows = table(raw, "the person's time")
        y, alone = _row(rows, mode="agents yield"), _row(rows, mode="alone")
        out.append(Headline(f"A person's 1,409-token prompt beside 8 generating agents ({raw.doc['config']['backend']['kind']})",
                            f"{fmt(y['ttft_s'])} s", f"alone {fmt(alone['ttft_s'])} s", y["x_alone"], "≤ 1.3",
                            met(y["x_alone"], 1.3, "<="), raw))
    return out


def _sequences(n: int) -> str:
    return f"{n} sequence{'' if n == 1 else 's'}"


def structured(results: Results) -> list[Headline]:
    raw = results.get("structured")
    per = [r for r in table(raw, "aggregate tok/s") if r["engine"] == "engine"]
    low = min(per, key=lambda r: r["json_schema ÷ free"])
    vs = _row(table(raw, "this engine ÷ llama-server"), mode="json_schema")
    return [
        Headline(f"json_schema replies ÷ free replies, this engine, the lowest over widths (at {_sequences(low['seqs'])})",
                 f"{fmt(low['json_schema tok/s'])} tok/s", f"free {fmt(low['free tok/s'])} tok/s",
                 low["json_schema ÷ free"], "≥ 0.9", met(low["json_schema ÷ free"], 0.9, ">="), raw),
        # Tokens are not the same work here: llama-server's grammar lets the model write JSON's
        # optional whitespace, so the same reply takes it more tokens; replies/s carries the target.
        Headline("json_schema replies, 8 sequences, end to end, in tokens (llama-server's replies "
                 "carry its grammar's optional whitespace: more tokens for the same reply)",
                 f"{fmt(vs['engine tok/s'])} tok/s", f"llama-server {fmt(vs['llama-server tok/s'])} tok/s",
                 vs["engine ÷ llama-server"], "-", None, raw),
    ] + ([Headline("json_schema replies, 8 sequences, the same work (replies/s)", f"{fmt(vs['engine replies/s'])} /s",
                   f"llama-server {fmt(vs['llama-server replies/s'])} /s", vs["replies/s engine ÷ llama-server"],
                   "≥ 1.0", met(vs["replies/s engine ÷ llama-server"], 1.0, ">="), raw)]
         if "replies/s engine ÷ llama-server" in vs else [])


def agents(results: Results) -> list[Headline]:
    out = []
    for key in ("agents-4-bursts-full", "agents-4-bursts-np20", "agents-4-bursts-np20-paired", "agents-4-bursts",
                "agents-4-bursts-paired",
                "agents-2-no-bursts",
                "agents-2-no-bursts-full", "agents-2-no-bursts-full-exact", "agents-2-no-bursts-full-exact-paired",
                "agents-2-no-bursts-full-exact-paired-streams", "agents-4-no-bursts-full-exact-paired-streams"):
        try:
            raw = results.get(key)
        except FileNotFoundError:
            if "-full" in key:  # the trace's whole tool results: a run that needs a quiet hour
                continue
            raise
        a = raw.doc["config"]["agents"]
        whole = f", {tool_results(raw)}"
        whole += ", every reply to its max_tokens" if a.get("exact_replies") else ""
        whole += ", both sides at once on a core each" if a.get("paired") else ""
        sides = table(raw, "per side")
        serve = target_serve(sides)
        if serve is None:
            continue  # llama-server against itself: no target
        best = table(raw, "serve ÷ llama-server")[0]["best llama-server (by makespan)"]
        for t in table(raw, "the issue's targets"):
            what = (f"Agent trace, {a['agents']} agents × {a['turns']} turns{whole}, {slots(raw)} slots, "
                    f"{fmt(kv_cells(raw))} KV cells: {t['target']}")
            mine = (f"evaluated {fmt(serve['evaluated'])}" if "evaluated" in t["target"]
                    else f"makespan {fmt(serve['makespan_s'])} s" if "makespan" in t["target"]
                    else f"TTFT p95 {fmt(serve['ttft_p95_s'])} s")
            peer = f"minimum {fmt(serve['minimum'])}" if "evaluated" in t["target"] else best
            bar = t["target"].split("≤ ", 1)[1].split("x")[0]
            out.append(Headline(what, f"{serve['side']}: {mine}", peer, t["measured"], f"≤ {bar}", t["met"], raw))
    return out


def throughput(results: Results) -> list[Headline]:
    """Issue 28's sweep when it is there (every width, 1 and 2 threads, the app's defaults off and
    on; at one thread the paired line instead, where there is one), else the quick line: each engine variant against llama-server at every width and against
    llama-batched-bench at 8 and 16 sequences (it neither samples nor streams)."""
    out = []
    for key in ("throughput-paired-1t", "throughput-sweep-1t", "throughput-sweep-2t"):
        try:
            raw = results.get(key)
        except FileNotFoundError:
            continue
        threads = raw.doc["data"]["backend"]["n_threads"]
        if raw.doc["config"]["throughput"].get("paired"):
            out += _throughput_paired(raw)
        elif not any(h.raw.doc["data"]["backend"]["n_threads"] == threads for h in out):
            # The paired line, where there is one, supersedes the sweep at its thread count.
            out += _throughput(raw, f", {threads} thread(s)", batched_from=8)
    return out or _throughput(results.get("throughput"), "", batched_from=1)


# Issue 28's bars: (peer, its short name in ratio columns, the bar); llama-batched-bench's holds at
# 8 sequences and more (it neither samples nor streams).
THROUGHPUT_BARS = (("llama-server -np N", "server", 1.0), ("llama-batched-bench", "batched-bench", 0.97))


def _throughput_paired(raw: Raw) -> list[Headline]:
    """Each engine variant against llama-server at every width and llama-batched-bench at 8 and
    16, both sides at once: the median of the repetitions' paired ratios."""
    out = []
    medians = table(raw, "per peer and batch width")
    tok_s = {(m["peer"], m["seqs"]): m["tok_s"] for m in medians}
    for row in table(raw, "both sides at once"):
        n = row["seqs"]
        for policy in raw.doc["config"]["throughput"]["policies"]:
            for peer, short, bar in THROUGHPUT_BARS:
                value = row.get(f"{policy} ÷ {short}")
                if value is None or (bar < 1.0 and n < 8):
                    continue
                out.append(Headline(f"Generated tok/s, {_sequences(n)}, 1 thread, same work, both at once on a core "
                                    "each (issue 28)", f"{policy} {fmt(tok_s[(f'engine {policy}', n)])} tok/s",
                                    f"{peer} {fmt(tok_s[(peer, n)])} tok/s", value, f"≥ {bar}",
                                    met(value, bar, ">="), raw))
    return out


def _throughput(raw: Raw, label: str, batched_from: int) -> list[Headline]:
    out = []
    for row in table(raw, "generated tok/s"):
        engines = [k for k in row if k.startswith("engine ") and "÷" not in k]
        for mine in engines:
            for peer, short, bar in THROUGHPUT_BARS:
                ratio = f"engine ÷ {short}"
                if row.get(peer) is None or (bar < 1.0 and row["seqs"] < batched_from):
                    continue
                # The result records each peer's ratio to the first engine variant; another
                # variant's is its tok/s over the peer's, from the same row.
                value = row.get(ratio) if mine == engines[0] else rnd(row[mine] / row[peer], 3)
                if value is None:
                    continue
                out.append(Headline(f"Generated tok/s, {_sequences(row['seqs'])}{label}, same work (issue 28)",
                                    f"{mine[len('engine '):]} {fmt(row[mine])} tok/s",
                                    f"{peer} {fmt(row[peer])} tok/s", value, f"≥ {bar}",
                                    met(value, bar, ">="), raw,
                                    derived="" if mine == engines[0] else "tok/s ÷ the peer's, same row"))
    return out


def serve(results: Results) -> list[Headline]:
    raw = results.get("serve")
    rows = table(raw, "concurrent clients")
    out = []
    for n in sorted({r["clients"] for r in rows}):
        reps = sorted({r["rep"] for r in rows if r["clients"] == n})
        mine = [_row(rows, clients=n, rep=k, peer="serve (this engine)")["agg_tok_s"] for k in reps]
        peer = [next(r for r in rows if r["clients"] == n and r["rep"] == k and r["peer"] != "serve (this engine)")
                for k in reps]
        ratio = round(median([m / p["agg_tok_s"] for m, p in zip(mine, peer)]), 3)
        out.append(Headline(f"OpenAI clients streaming at once, {n} clients, aggregate tok/s (median of the "
                            "repetitions' ratios)", Cell(*mine), f"{peer[0]['peer']}: {Cell(*[p['agg_tok_s'] for p in peer]).text}",
                            ratio, "≥ 0.95", met(ratio, 0.95, ">="), raw,
                            derived="median over repetitions of serve ÷ llama-server agg_tok_s"))
    return out


def remote(results: Results) -> list[Headline]:
    raw = results.get("remote")
    # No target: the claim is that a remote server and the local engine behind one EngineClient
    # make the same work; the ratio is recorded remote ÷ local.
    return [Headline(f"This app on llama-server -np 8 against its local engine, {r['seqs']} sequences, tok/s "
                     "(ratio: llama-server ÷ local)", f"local {fmt(r['local tok/s'])} tok/s",
                     f"llama-server {fmt(r['remote tok/s'])} tok/s", r["remote/local"], "-", None, raw)
            for r in table(raw, "aggregate tok/s")]


def fork(results: Results) -> list[Headline]:
    raw = results.get("fork")
    rows = table(raw, "subagent time to first token")
    forked, cold = _row(rows, mode="forked"), _row(rows, mode="cold")
    # No target: the claim is the mechanism (every subagent reuses the parent's cells); the bench
    # records the speed-up as cold ÷ forked.
    return [Headline(f"{forked['subagents']} subagents forked from a {fmt(forked['cached_min'])}-token parent, TTFT p50 "
                     "(ratio: cold ÷ forked)", f"forked {fmt(forked['ttft_p50_s'])} s",
                     f"the same prompts cold {fmt(cold['ttft_p50_s'])} s", forked["x_faster_p50"], "-", None, raw)]


def admit(results: Results) -> list[Headline]:
    raw = results.get("admit")
    out = []
    for title, rows in raw.doc["tables"].items():
        targets = [r for r in rows if r["policy"].startswith("target:")]
        if not targets:
            continue
        mid, pf = targets[len(targets) // 2], _row(rows, policy="prefill-first")
        ok = mid["keep"] >= 0.5 and mid["ttft_x_pf"] <= 1.6
        out.append(Headline(f"A long prompt arrives while 8 sequences generate, `{mid['policy']}` ({title.split(',')[0]}; "
                            "ratio: newcomer TTFT ÷ prefill-first's)",
                            f"keep {fmt(mid['keep'])} of the running rate, TTFT {fmt(mid['ttft_s'])} s",
                            f"prefill-first: TTFT {fmt(pf['ttft_s'])} s", mid["ttft_x_pf"],
                            "keep ≥ 0.5 and ≤ 1.6", ok, raw))
    return out


def ui(results: Results) -> list[Headline]:
    raw = results.get("ui")
    out = []
    for k in table(raw, "keypress-to-screen"):
        out.append(Headline(f"Keypress to screen while 8 panes stream, engine on {k['threads']} thread(s), p95",
                            f"p95 {fmt(k['p95_ms'])} ms (p50 {fmt(k['p50_ms'])} ms, {fmt(k['keys'])} keys)", "-", "-",
                            "p95 ≤ 50 ms", met(k["p95_ms"], 50.0, "<="), raw))
    for s in table(raw, "engine step time"):
        if s["mode"] == "ui":
            # No target recorded for this one: what the app's own CPU costs the engine's step.
            out.append(Headline(f"8-row engine step with the app attached ÷ headless, {s['threads']} thread(s)",
                                f"{fmt(s['step_ms_p50'])} ms", "headless", s["ui/headless"], "-", None, raw))
    return out


def callgrind(results: Results) -> list[Headline]:
    raw = results.get("issue28-callgrind")
    res = raw.doc["results"]
    peer = next(r for r in res if r["side"] == "bench")
    mine = next(r for r in res if r["side"] == "engine" and r["flash"] == "on")
    ratio = round(mine["step_ir_median"] / peer["step_ir_median"], 5)
    # No target: issue 28's is throughput on a quiet machine; this count says the work is the same.
    return [Headline("Native instructions per 8-row decode step (callgrind), flash attention",
                     f"{fmt(mine['step_ir_median'])} Ir", f"llama-batched-bench {fmt(peer['step_ir_median'])} Ir",
                     ratio, "-", None, raw, derived="step_ir_median ÷ the peer's")]


HEADLINES: tuple[Callable[[Results], list[Headline]], ...] = (throughput, serve, remote, fork, admit, ui, resume, spec, person, structured, agents,
                                                                 callgrind)


def summary(results: Results) -> str:
    rows = []
    for make in HEADLINES:
        for h in make(results):
            r = h.raw
            rows.append([h.what, h.engine, h.peer, h.ratio, h.target, h.met, machine(r), r.date, f"`{r.command}`",
                         f"`{r.file}`"])
    return md_table(["what", "this engine", "the peer", "ratio", "target", "met", "machine", "date", "command", "raw"],
                    rows)
