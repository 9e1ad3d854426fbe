"""Provides `bench structured`: JSON-schema-constrained replies against free text on the same engine, and against llama-server with the same schema."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from jsonschema import Draft202012Validator

from backend.factory import BackendConfig
from magnitude_bench.common import BenchResult, measured
from magnitude_bench.harness import alternating, client_run, recorded, started
from magnitude_bench.remote import TOPICS
from magnitude_tui.engine.protocol import EngineClient
from scheduler.speculation import SpecMode
from scheduler.stats import median, rnd
from scheduler.types import DoneReason, Message, Priority, Request, SamplingParams

# Bounded strings and a small integer, so a constrained reply closes well within max_tokens.
# (No minimum/maximum: llama-cpp-python's converter does not bound integers, see docs/BENCHMARKS.md.)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 24},
                         "age": {"type": "integer"},
                         "city": {"type": "string", "minLength": 1, "maxLength": 24}}}
FREE, CONSTRAINED = "free", "json_schema"


@dataclass(frozen=True)
class StructuredConfig:
    seqs: tuple[int, ...] = (1, 8, 16)
    max_tokens: int = 48  # a JSON reply's bound (it closes well within it)
    # A free reply's bound; None: as long as the JSON replies run (their median at the warm-up), so
    # both modes generate the same tokens after the same prompt and the ratio prices the grammar alone.
    free_tokens: int | None = None
    reps: int = 2  # modes alternate which goes first in each repetition
    peer: bool = True  # llama-server -np `peer_clients`, the same schema, as many HTTP clients
    peer_clients: int = 8
    threads: int = 1
    policy: str = "target:50"
    in_process: bool = False  # the engine in a thread of this process (tests) instead of a worker process
    timeout_s: float = 600.0


def prompt(i: int, run: int = 0) -> str:
    # The run's number first: no run finds its prompts cached by an earlier one (llama-server keeps
    # each slot's last prompt; this engine closes the sessions), so every run pays its prefill.
    return (f"Story {run:03d}-{i}: invent a character who lives in {TOPICS[i % len(TOPICS)]}. "
            "Give the character's name, age and city.")


def requests(n: int, mode: str, cfg: StructuredConfig, tag: str, run: int = 0) -> list[Request]:
    """n distinct prompts (run `run`'s), greedy, one fresh session each, classed as `serve` classes
    an API call (an agent's): the peer gets the same requests over HTTP."""
    bound = cfg.max_tokens if mode == CONSTRAINED or cfg.free_tokens is None else cfg.free_tokens
    sampling = SamplingParams(temperature=0.0, max_tokens=bound, seed=1)
    schema = json.dumps(SCHEMA) if mode == CONSTRAINED else None
    return [Request(f"{tag}-{i}", f"{tag}-s{i}", (Message("user", prompt(i, run)),), sampling,
                    response_schema=schema, priority=Priority.AGENT) for i in range(n)]


def burst(client: EngineClient, reqs: list[Request], timeout_s: float) -> dict:
    """Every request at once on any EngineClient; wall time to the last done, tokens, grammar time,
    and how many replies parse and validate against SCHEMA. The conversations stay open, as a
    server's do between calls (`run_side` closes them): each side keeps what it caches, this
    engine idle conversations, llama-server its slots' last prompts, and a later run may reuse
    the prompt text they share (the chat template's system turn)."""
    tr = client_run(client, reqs, timeout_s, what=f"{len(reqs)} replies: ")
    finals = tr.final.values()
    wall, made = tr.wall_s, tr.generated()
    grammar_ms = sum(u.grammar_ms for u in finals)
    return {"wall_s": wall, "made": made, "tok_s": made / wall, "tg_tok_s": tr.decode_tok_s(made, len(reqs)),
            "grammar_ms": grammar_ms,
            "grammar_share": grammar_ms / (wall * 1000.0), "valid": sum(valid(tr.texts[r.request_id]) for r in reqs),
            "replies": len(reqs), "stopped": sum(u.done_reason is DoneReason.STOP for u in finals),
            "sample": tr.texts[reqs[0].request_id][:120]}


def valid(reply: str) -> bool:
    try:
        return Draft202012Validator(SCHEMA).is_valid(json.loads(reply))
    except ValueError:
        return False


def run_side(name: str, client: EngineClient, model: str, widths: tuple[int, ...], cfg: StructuredConfig,
             progress, pids: tuple[int, ...] = ()) -> tuple[list[dict], StructuredConfig]:
    """Every width and repetition on one started client (serving `model`), both modes each time;
    one row per run, and the config they ran under (its free replies' bound settled at the warm-up)."""
    sessions: list[str] = []
    try:
        # As wide as the widest run: an engine just started trusts its cost model a few prompt rows at
        # a time until steps bear it out (its ramp); one that has served a while does not. Whole JSON
        # replies, so their length can bound the free ones.
        warm = requests(max(widths), CONSTRAINED, cfg, f"{name}-warm")
        sessions += [r.session_id for r in warm]
        w = burst(client, warm, cfg.timeout_s)
        if cfg.free_tokens is None:
            cfg = replace(cfg, free_tokens=max(1, round(w["made"] / w["replies"])))
            progress(f"{name}: free replies bounded at {cfg.free_tokens} tokens, the JSON replies' length")
        runs = []
        for n in widths:
            for rep, mode in alternating((FREE, CONSTRAINED), cfg.reps):
                tag = f"{name}-{n}-{rep}-{mode}"
                run = 10 * n + 2 * rep + (mode == CONSTRAINED)  # the same prompts on both sides
                tries = iter(range(100))

                def attempt() -> dict:  # a repeat (a disturbed run) sends fresh conversations
                    reqs = requests(n, mode, cfg, f"{tag}-{next(tries)}", run)
                    sessions.extend(r.session_id for r in reqs)
                    return burst(client, reqs, cfg.timeout_s)

                r, busy = measured(attempt, pids=pids, progress=progress)
                runs.append({"engine": name, "seqs": n, "rep": rep + 1, "mode": mode, **r,
                             "others_cores": busy, "model": model})
                progress(f"{name} {n} seqs rep {rep + 1} {mode}: {r['tok_s']:.1f} tok/s, "
                         f"{r['valid']}/{n} valid, grammar {r['grammar_share']:.1%}")
        return runs, cfg
    finally:
        for sid in sessions:
            client.close_session(sid)


@recorded
def run_structured(backend: BackendConfig, cfg: StructuredConfig, progress=lambda s: None) -> BenchResult:
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig

    n_ctx = backend.n_ctx or max(8192, max(cfg.seqs) * (cfg.max_tokens + 160))
    backend = replace(backend, n_ctx=n_ctx, n_seq_max=max(backend.n_seq_max, max(cfg.seqs)),
                      n_threads=backend.n_threads or cfg.threads)
    result = BenchResult("structured", "bench structured: json_schema-constrained vs free replies",
                         config={"structured": asdict(cfg), "backend": asdict(backend), "schema": SCHEMA})
    # Speculation off: a constrained sequence never drafts, so free text must not either.
    engine = WorkerClient(EngineConfig(backend, policy=cfg.policy, spec=SpecMode.OFF, auto_threads=False),
                          in_process=cfg.in_process, log_path=None if cfg.in_process else "auto")
    result.data["free_tokens_matched"] = cfg.free_tokens is None
    with started(engine, cfg.timeout_s) as ready:
        # The worker process is ours, not a neighbour: its CPU is not "others".
        runs, cfg = run_side("engine", engine, ready.model, cfg.seqs, cfg, progress,
                             pids=(engine.pid,) if engine.pid else ())
    # Both sides' free replies share one bound (the engine's), so their free runs are the same work.
    result.data["free_tokens"] = cfg.free_tokens
    if cfg.peer:
        runs += _peer_runs(backend, cfg, result, progress)
    _tables(result, runs, cfg)
    result.data["runs"] = runs
    return result


def _peer_runs(backend: BackendConfig, cfg: StructuredConfig, result: BenchResult, progress) -> list[dict]:
    """llama-server on the same model and threads, driven through the remote engine (which sends
    the schema as `response_format: json_schema`), `peer_clients` at once."""
    from magnitude_bench.peers import PeerError, Server, model_path, tool_info, tools_dir
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig

    found = tools_dir() if backend.family == "llama" else None
    if found is None:
        result.notes.append("llama-server peer left out: " + ("not built (scripts/build_llama_tools.sh)"
                                                              if backend.family == "llama" else "not a real model"))
        return []
    result.data["tools"] = tool_info(found[0])
    n = cfg.peer_clients
    try:
        with Server.on_cpu(found[0], model=model_path(backend.model), parallel=n,
                           threads=backend.n_threads or cfg.threads, n_ctx=backend.n_ctx or 8192) as srv:
            result.data["peer_cmd"] = srv.cmd
            client = RemoteClient(RemoteConfig((f"http://127.0.0.1:{srv.port}",), max_in_flight=n))
            with started(client, cfg.timeout_s) as ready:
                return run_side("llama-server", client, ready.model, (n,), cfg, progress,
                                pids=(srv.pid,) if srv.pid else ())[0]
    except PeerError as e:
        result.notes.append(f"llama-server peer failed: {e}")
        return []


def _tables(result: BenchResult, runs: list[dict], cfg: StructuredConfig) -> None:
    rows = []
    for (eng, n) in dict.fromkeys((r["engine"], r["seqs"]) for r in runs):
        at = [r for r in runs if r["engine"] == eng and r["seqs"] == n]
        by = {m: [r for r in at if r["mode"] == m] for m in (FREE, CONSTRAINED)}
        # The ratio per repetition (both modes ran side by side), then their median.
        ratios = [c["tok_s"] / f["tok_s"] for f, c in zip(by[FREE], by[CONSTRAINED]) if f["tok_s"]]
        tg_ratios = [c["tg_tok_s"] / f["tg_tok_s"] for f, c in zip(by[FREE], by[CONSTRAINED])
                     if f["tg_tok_s"] and c["tg_tok_s"]]
        rows.append({"engine": eng, "seqs": n,
                     "free tok/s": rnd(median(r["tok_s"] for r in by[FREE]), 1),
                     "json_schema tok/s": rnd(median(r["tok_s"] for r in by[CONSTRAINED]), 1),
                     "json_schema ÷ free": rnd(median(ratios), 3),
                     "decode free": rnd(median(tgs(by[FREE])), 1),
                     "decode json": rnd(median(tgs(by[CONSTRAINED])), 1),
                     "decode json ÷ free": rnd(median(tg_ratios), 3),
                     # A server reports no grammar time to its client.
                     "grammar share": rnd(median(r["grammar_share"] for r in by[CONSTRAINED]), 3)
                     if eng == "engine" else None,
                     "free replies/s": rnd(median(r["replies"] / r["wall_s"] for r in by[FREE]), 2),
                     "json replies/s": rnd(median(r["replies"] / r["wall_s"] for r in by[CONSTRAINED]), 2),
                     "tokens/reply free": rnd(median(r["made"] / r["replies"] for r in by[FREE]), 1),
                     "tokens/reply json": rnd(median(r["made"] / r["replies"] for r in by[CONSTRAINED]), 1),
                     "valid json": f"{sum(r['valid'] for r in by[CONSTRAINED])}/{sum(r['replies'] for r in by[CONSTRAINED])}",
                     "reps": len(ratios),
                     "others_cores_max": rnd(max(r["others_cores"] for r in at), 2)})
    result.tables[f"aggregate tok/s, median of {cfg.reps} alternating repetitions"] = rows
    ours = next((r for r in rows if r["engine"] == "engine" and r["seqs"] == cfg.peer_clients), None)
    theirs = next((r for r in rows if r["engine"] == "llama-server"), None)
    if ours and theirs:
        result.tables[f"this engine ÷ llama-server, {cfg.peer_clients} sequences"] = [
            {"mode": m, "engine tok/s": ours[f"{m} tok/s"], "llama-server tok/s": theirs[f"{m} tok/s"],
             "engine ÷ llama-server": _ratio(ours[f"{m} tok/s"], theirs[f"{m} tok/s"]),
             "engine decode": ours[f"decode {short}"], "llama-server decode": theirs[f"decode {short}"],
             "decode engine ÷ llama-server": _ratio(ours[f"decode {short}"], theirs[f"decode {short}"]),
             "engine replies/s": ours[f"{short} replies/s"], "llama-server replies/s": theirs[f"{short} replies/s"],
             "replies/s engine ÷ llama-server": _ratio(ours[f"{short} replies/s"], theirs[f"{short} replies/s"])}
            for m, short in ((FREE, "free"), (CONSTRAINED, "json"))]
    result.notes += [
        "tok/s = tokens generated by all sequences / wall time from the first submit to the last reply "
        "(prefill included), measured on the client; greedy, the same prompts in both modes",
        f"free replies are bounded at {cfg.free_tokens} tokens" + (
            ", the median length of this engine's JSON replies at the warm-up: both modes generate about "
            "the same tokens per reply after prompts of the same length, so json_schema ÷ free prices the "
            "grammar, not a different prefill share" if result.data.get("free_tokens_matched") else ""),
        "decode = tok/s from the moment every sequence has its first token to the last reply (prefill excluded)",
        "replies/s = replies / wall time, the same work on both sides: each side's grammar lays out the "
        "JSON its own way (this engine's without optional whitespace, so in fewer tokens per reply), "
        "which tok/s counts as less work",
        "grammar share = the requests' summed grammar_ms (masking under the schema, on the engine thread) / wall",
        "targets: json_schema ÷ free >= 0.9; engine ÷ llama-server (json_schema) >= 1.0",
        "others_cores: cores other processes kept busy during a run (a shared machine)",
    ]


def _ratio(a: float | None, b: float | None) -> float | None:
    return rnd(a / b, 3) if a and b else None


def tgs(runs: list[dict]) -> list[float]:
    return [r["tg_tok_s"] for r in runs if r["tg_tok_s"]]
