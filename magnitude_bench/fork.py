"""Provides `bench fork`: TTFT of N subagents forked from a long parent context vs the same N started cold."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from backend.factory import BackendConfig
from magnitude_bench.common import OTHERS_NOTE, BenchResult, backend_info, loaded, prompt_tokens, sized
from magnitude_bench.harness import Drive, recorded, sweep
from scheduler.stats import median, rnd
from scheduler.types import Request, SamplingParams


@dataclass(frozen=True)
class ForkConfig:
    n: int = 8  # subagents
    parent_tokens: int = 1500  # the shared context
    task_tokens: int = 32  # each subagent's own task text after the shared context
    gen: int = 8  # tokens each subagent generates
    policy: str = "target:50"
    reps: int = 1


def _run(drive: Drive, reqs: list[Request]) -> dict:
    """Submit all at once and run to the end: per-request TTFT, cached tokens, prompt rows evaluated."""
    tr = drive.run(reqs)
    ids = [r.request_id for r in reqs]
    return {"ttft": [tr.ttft(rid) for rid in ids], "cached": [tr.cached[rid] for rid in ids],
            "prefill_rows": sum(s.prefill_rows for s in tr.steps), "steps": len(tr.steps),
            "total_s": tr.wall_s}


@recorded
def run_fork(spec: BackendConfig, cfg: ForkConfig, progress=lambda s: None) -> BenchResult:
    need = (cfg.n + 1) * (cfg.parent_tokens + cfg.task_tokens + cfg.gen) + 512
    spec = sized(spec, cells=need, seqs=cfg.n + 1)
    with loaded(spec) as backend:
        parent = prompt_tokens(backend, cfg.parent_tokens, salt=5)
        # Cold: contexts of the same length that share nothing, or the engine would evaluate the first
        # one and copy it to the others (a request waits for a prefix another is evaluating).
        colds = [prompt_tokens(backend, cfg.parent_tokens, salt=1000 + 17 * i) for i in range(cfg.n)]
        tasks = [prompt_tokens(backend, cfg.task_tokens, salt=200 + 13 * i) for i in range(cfg.n)]

        def one(mode: str, rep: int) -> dict:
            r = _one(backend, cfg, mode, parent, tasks, colds)
            progress(f"rep {rep + 1} {mode}: TTFT p50 {median(r['ttft']):.3f} s, max {max(r['ttft']):.3f} s, "
                     f"{r['prefill_rows']} prompt rows")
            return r

        runs = sweep(("forked", "cold"), cfg.reps, one, quiet=not spec.simulated, progress=progress)
        info = backend_info(backend)
    return _result(spec, cfg, runs, info)


def _one(backend, cfg: ForkConfig, mode: str, parent: tuple[int, ...], tasks: list[tuple[int, ...]],
         colds: list[tuple[int, ...]]) -> dict:
    """One measurement: (forked) the parent's turn leaves its context resident, then N subagents
    fork from it; (cold) N prompts of the same length from nothing, sharing no prefix."""
    drive = Drive(backend, policy=cfg.policy, gen_reserve=cfg.gen)
    parent_run = None
    if mode == "forked":
        parent_run = _run(drive, [Request("parent", "parent", (), SamplingParams(max_tokens=1), prompt_tokens=parent)])
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.gen)
    reqs = [Request(f"sub{i}", f"sub{i}", (), sampling, fork_from="parent" if mode == "forked" else None,
                    prompt_tokens=(parent if mode == "forked" else colds[i]) + task) for i, task in enumerate(tasks)]
    r = _run(drive, reqs)
    r["parent_ttft_s"] = parent_run["ttft"][0] if parent_run else None
    drive.close()
    return r


def _result(spec: BackendConfig, cfg: ForkConfig, runs: list[dict], info: dict) -> BenchResult:
    res = BenchResult(name="fork", title=f"bench fork: {cfg.n} subagents over a {cfg.parent_tokens:,}-token context",
                      config={"fork": asdict(cfg), "backend": asdict(spec)}, repetitions=runs)
    out = {mode: [r for r in runs if r["config"] == mode] for mode in ("forked", "cold")}
    rows = []
    for mode, runs in out.items():
        ttfts = [t for r in runs for t in r["ttft"]]
        rows.append({
            "mode": mode,
            "subagents": cfg.n,
            "ttft_p50_s": rnd(median(ttfts), 3),
            "ttft_max_s": rnd(max(ttfts), 3),
            "all_first_s": rnd(median(max(r["ttft"]) for r in runs), 3),
            "prompt_rows": int(median(r["prefill_rows"] for r in runs) or 0),
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
        OTHERS_NOTE,
        *([f"speed-up at the median: {forked['x_faster_p50']}x"] if forked.get("x_faster_p50") else []),
    ]
    return res
