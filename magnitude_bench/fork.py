"""Provides `bench fork`: TTFT of N subagents forked from a long parent context vs the same N started cold."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, replace

from backend.factory import BackendConfig, build_backend
from magnitude_bench.common import (BenchResult, FixedLength, backend_clock, backend_info,
                                        machine_info, measured, median, prompt_tokens, reset_kv, rnd)
from magnitude_tui.engine.core import Engine
from scheduler.budget import parse_policy
from scheduler.types import Request, SamplingParams


@dataclass(frozen=True)
class ForkConfig:
    n: int = 8  # subagents
    parent_tokens: int = 1500  # the shared context
    task_tokens: int = 32  # each subagent's own task text after the shared context
    gen: int = 8  # tokens each subagent generates
    policy: str = "target:50"
    reps: int = 1


def _run(engine: Engine, clock, reqs: list[Request]) -> dict:
    """Submit all at once and run to the end: per-request TTFT, cached tokens, prompt rows evaluated."""
    t0 = clock()
    for r in reqs:
        engine.submit(r)
    first: dict[str, float] = {}
    cached: dict[str, int] = defaultdict(int)
    prefill_rows = steps = 0
    while engine.has_work():
        report = engine.step()
        if report is None:
            continue
        steps += 1
        prefill_rows += report.prefill_rows
        for u in report.updates:
            if u.error:
                raise RuntimeError(f"request {u.request_id} failed: {u.error}")
            cached[u.request_id] = max(cached[u.request_id], u.cached_tokens)
            if u.new_tokens and u.request_id not in first:
                first[u.request_id] = report.t - t0
    return {"ttft": [first[r.request_id] for r in reqs], "cached": [cached[r.request_id] for r in reqs],
            "prefill_rows": prefill_rows, "steps": steps, "total_s": clock() - t0}


def run_fork(spec: BackendConfig, cfg: ForkConfig, progress=lambda s: None) -> BenchResult:
    need = (cfg.n + 1) * (cfg.parent_tokens + cfg.task_tokens + cfg.gen) + 512
    spec = replace(spec, n_ctx=spec.n_ctx or max(8192, -(-need // 1024) * 1024),
                   n_seq_max=max(spec.n_seq_max, cfg.n + 1))
    backend = build_backend(spec)
    clock = backend_clock(backend)
    parent = prompt_tokens(backend, cfg.parent_tokens, salt=5)
    # Cold: contexts of the same length that share nothing, or the engine would evaluate the first
    # one and copy it to the others (a request waits for a prefix another is evaluating).
    colds = [prompt_tokens(backend, cfg.parent_tokens, salt=1000 + 17 * i) for i in range(cfg.n)]
    tasks = [prompt_tokens(backend, cfg.task_tokens, salt=200 + 13 * i) for i in range(cfg.n)]
    out: dict[str, list[dict]] = {"forked": [], "cold": []}
    try:
        for rep in range(cfg.reps):
            for mode in ("forked", "cold"):
                run = lambda: _one(backend, clock, cfg, mode, parent, tasks, colds)  # noqa: E731
                r, busy = (run(), 0.0) if spec.simulated else measured(run, progress=progress)
                r["others_cores"] = busy
                out[mode].append(r)
                progress(f"rep {rep + 1} {mode}: TTFT p50 {median(r['ttft']):.3f} s, max {max(r['ttft']):.3f} s, "
                         f"{r['prefill_rows']} prompt rows")
        info = backend_info(backend)
    finally:
        backend.close()
    return _result(spec, cfg, out, info)


def _one(backend, clock, cfg: ForkConfig, mode: str, parent: tuple[int, ...], tasks: list[tuple[int, ...]],
         colds: list[tuple[int, ...]]) -> dict:
    """One measurement: (forked) the parent's turn leaves its context resident, then N subagents
    fork from it; (cold) N prompts of the same length from nothing, sharing no prefix."""
    reset_kv(backend)
    engine = Engine(FixedLength(backend), policy=cfg.policy, coalesce_ms=0.0, gen_reserve=cfg.gen)
    if parse_policy(cfg.policy).target_ms is not None:
        engine.calibrate()
    parent_run = None
    if mode == "forked":
        parent_run = _run(engine, clock, [Request("parent", "parent", (), SamplingParams(max_tokens=1),
                                                  prompt_tokens=parent)])
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.gen)
    reqs = [Request(f"sub{i}", f"sub{i}", (), sampling, fork_from="parent" if mode == "forked" else None,
                    prompt_tokens=(parent if mode == "forked" else colds[i]) + task) for i, task in enumerate(tasks)]
    r = _run(engine, clock, reqs)
    r["parent_ttft_s"] = parent_run["ttft"][0] if parent_run else None
    reset_kv(backend)
    return r


def _result(spec: BackendConfig, cfg: ForkConfig, out: dict, info: dict) -> BenchResult:
    res = BenchResult(name="fork", title=f"bench fork: {cfg.n} subagents over a {cfg.parent_tokens:,}-token context",
                      config={"fork": asdict(cfg), "backend": asdict(spec)}, machine=machine_info())
    rows = []
    for mode, runs in out.items():
        ttfts = [t for r in runs for t in r["ttft"]]
        rows.append({
            "mode": mode,
            "subagents": cfg.n,
            "ttft_p50_s": rnd(median(ttfts), 3),
            "ttft_max_s": rnd(max(ttfts), 3),
            "all_first_s": rnd(median(max(r["ttft"]) for r in runs), 3),
            "prompt_rows": int(median(r["prefill_rows"] for r in runs)),
            "cached_min": min(c for r in runs for c in r["cached"]),
            "total_s": rnd(median(r["total_s"] for r in runs), 3),
            "parent_ttft_s": rnd(median(r["parent_ttft_s"] for r in runs), 3) if mode == "forked" else None,
            "others_cores": rnd(max(r["others_cores"] for r in runs), 2),
        })
    cold, forked = rows[1], rows[0]
    for r in rows:
        r["x_faster_p50"] = rnd(cold["ttft_p50_s"] / r["ttft_p50_s"], 1) if r["ttft_p50_s"] else None
    res.tables["subagent time to first token, forked vs cold (all submitted at once)"] = rows
    res.data = {"ttft_s": {m: [rnd(t, 4) for r in runs for t in r["ttft"]] for m, runs in out.items()},
                "backend": info, "label": f"{info['backend']}: {cfg.n} subagents, {cfg.parent_tokens:,}-token "
                f"shared context + {cfg.task_tokens} own tokens, {cfg.policy}"}
    res.notes += [
        "forked: each subagent starts from a copy of the parent's KV prefix (llama_memory_seq_cp, shared cells) "
        "and evaluates only its own task tokens; cold: prompts of the same length sharing no prefix, nothing reused",
        f"TTFT from the moment all {cfg.n} requests are submitted; the parent's own turn "
        f"(parent_ttft_s) is not part of the forked TTFT",
        "others_cores: cores other processes kept busy during a measurement (a shared machine); one over 0.25 "
        "was measured again, up to twice, after waiting for the machine to go quiet",
        f"speed-up at the median: {forked['x_faster_p50']}x" if forked.get("x_faster_p50") else "",
    ]
    res.notes = [n for n in res.notes if n]
    return res
