"""Provides `bench burst`: N subagents forked at once from a long conversation, every policy, flash attention on and off."""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass

from backend.factory import BackendConfig
from magnitude_bench import peers
from magnitude_bench.common import (
    BenchResult,
    backend_info,
    cpu_clock_for,
    loaded,
    measured,
    not_quiet_notes,
    prompt_tokens,
    sized,
)
from magnitude_bench.harness import Drive, calibrated, recorded
from scheduler.stats import median, percentile, rnd
from scheduler.types import Request, SamplingParams

# `target-v1:50` is target:50 as it was before it knew depth and occupancy: with llama.cpp's
# default attention (flash attention on, on this CPU) that is the code path the issue measured.
DEFAULT_POLICIES = ("target:50", "prefill-first", "fixed:2048", "target-v1:50")


@dataclass(frozen=True)
class BurstConfig:
    n: int = 11  # subagents
    context: int = 2000  # tokens of the conversation they fork from
    own: int = 200  # each subagent's own prompt tokens after the shared context
    gen: int = 48  # tokens each subagent generates
    policies: tuple[str, ...] = DEFAULT_POLICIES
    flash: tuple[str, ...] = ("off", "on")
    peer_gen: int = 16  # llama-batched-bench -ntg
    # Time in CPU seconds of this process (and of the peer's process) instead of wall seconds.
    # With one thread every step computes on the calling thread, so CPU time is the work done,
    # whatever else the machine runs: on a shared machine wall time measures the neighbours.
    cpu_clock: bool = False


@dataclass
class BurstRun:
    ttft_s: list[float]
    itl_ms: list[float]
    decode_step_ms: list[float]  # steps holding every subagent's decode row and nothing else
    total_s: float
    steps: int
    prompt_rows: int
    kv_idle_after: int
    evicted_for_speed: int


def run_burst(backend, policy: str, cfg: BurstConfig, params=None) -> BurstRun:
    """The parent's turn leaves `context` tokens resident; then N subagents fork from it at once,
    each with its own `own` tokens, and generate `gen` tokens each."""
    drive = Drive(backend, policy=policy, gen_reserve=cfg.gen, clock=cpu_clock_for(backend, cfg.cpu_clock),
                  params=params, calibrate=False)
    parent = prompt_tokens(backend, cfg.context, salt=5)
    drive.run([Request("parent", "parent", (), SamplingParams(max_tokens=1), prompt_tokens=parent)])
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.gen)
    subs = [Request(f"sub{i}", f"sub{i}", (), sampling, fork_from="parent",
                    prompt_tokens=parent + prompt_tokens(backend, cfg.own, salt=300 + 17 * i)) for i in range(cfg.n)]
    tr = drive.run(subs)
    t0 = tr.submitted["sub0"]
    busy = tr.busy_steps
    evicted = drive.engine.scheduler.num_evicted_for_speed
    drive.close()
    ids = [r.request_id for r in subs]
    return BurstRun(ttft_s=[tr.ttft(rid) for rid in ids], itl_ms=[g for rid in ids for g in tr.itl_ms(rid)],
                    decode_step_ms=[s.step_ms for s in busy if s.decode_rows == cfg.n and s.prefill_rows == 0],
                    total_s=max(tr.tokens[rid][-1] for rid in ids) - t0, steps=len(busy),
                    prompt_rows=sum(s.prefill_rows for s in busy),
                    kv_idle_after=tr.steps[-1].kv_idle if tr.steps else 0, evicted_for_speed=evicted)


def _row(flash: str, policy: str, r: BurstRun, busy: float) -> dict:
    return {
        "flash_attn": flash, "policy": policy,
        "ttft_p50_s": rnd(median(r.ttft_s), 2), "ttft_max_s": rnd(max(r.ttft_s), 2),
        "itl_p50_ms": rnd(percentile(r.itl_ms, 50), 1), "itl_p95_ms": rnd(percentile(r.itl_ms, 95), 1),
        "decode_step_ms": rnd(median(r.decode_step_ms), 1) if r.decode_step_ms else None,
        "total_s": rnd(r.total_s, 2), "steps": r.steps, "prompt_rows": r.prompt_rows,
        "idle_kv_after": r.kv_idle_after, "evicted_idle": r.evicted_for_speed,
        "others_cores": rnd(busy, 2),
    }


@recorded
def run_bursts(spec: BackendConfig, cfg: BurstConfig, progress=lambda s: None) -> BenchResult:
    res = BenchResult(name="burst", title=f"bench burst: {cfg.n} subagents x {cfg.own} own tokens forked from "
                      f"a {cfg.context:,}-token conversation", config={"burst": asdict(cfg), "backend": asdict(spec)})
    need = cfg.context + cfg.n * (cfg.own + cfg.gen) + 1024
    rows, info = [], {}
    flashes = cfg.flash if not spec.simulated else ("profile",)
    for flash in flashes:
        fspec = sized(spec, cells=need, seqs=cfg.n + 1, flash_attn=flash if flash != "profile" else "auto")
        with loaded(fspec) as backend:
            params = calibrated(backend, cpu_clock_for(backend, cfg.cpu_clock))
            info[flash] = backend_info(backend, params)
            for policy in cfg.policies:
                if policy.startswith("target-v1") and flash == "off":
                    continue  # the old code path ran llama.cpp's default attention (on, here)
                run = lambda: run_burst(backend, policy, cfg, params)  # noqa: E731
                r, busy = (run(), 0.0) if spec.simulated else measured(run, retries=1, progress=progress)
                rows.append(_row(flash, policy, r, busy))
                progress(f"flash {flash} {policy:>14}: TTFT p50 {rows[-1]['ttft_p50_s']} s, max "
                         f"{rows[-1]['ttft_max_s']} s, decode step {rows[-1]['decode_step_ms']} ms, total "
                         f"{rows[-1]['total_s']} s")
    _ratios(rows)
    res.tables["per policy and attention path"] = rows
    if not spec.simulated:
        peer = _peer_rows(fspec, cfg, progress)
        if peer:
            res.tables["llama-batched-bench at the same depth and width (-pps -kvu)"] = peer
            best = min((p["decode_step_ms"] for p in peer if p["decode_step_ms"]), default=None)
            for x in rows:
                x["decode_x_peer_best"] = rnd(x["decode_step_ms"] / best, 2) if best and x["decode_step_ms"] else None
    res.data = {"backends": info}
    res.notes += [
        f"TTFT from the moment the {cfg.n} subagents are submitted (together); the parent's {cfg.context:,}-token "
        "turn runs first and is not timed; every subagent shares its cells (fork) and evaluates only its own tokens",
        f"decode_step_ms: median step holding the {cfg.n} subagents' decode rows and nothing else (depth "
        f"{cfg.context + cfg.own}..{cfg.context + cfg.own + cfg.gen})",
        "ttft_x_pf: subagent TTFT p50 / prefill-first's with the same attention path; ttft_x_v1: / target-v1:50's "
        "(the policy before this change) with flash attention on (llama.cpp's default here)",
        "idle_kv_after: cells held only by idle conversations when the burst ended; evicted_idle: idle "
        "conversations evicted because their cells slowed every row (flash attention off only)",
        "others_cores: cores other processes kept busy during a measurement (a shared machine)",
    ]
    if cfg.cpu_clock:
        res.notes.append("times are CPU seconds of the engine's process (one thread: every step computes on it) "
                         "and, for llama-batched-bench, the CPU time of a run with twice the generated tokens minus "
                         "one with the given number, per step; pp_tok_s and tg_tok_s are the peer's own wall figures")
    res.notes += not_quiet_notes()
    return res


def _ratios(rows: list[dict]) -> None:
    old = [r for r in rows if r["policy"].startswith("target-v1")]
    # The old code path ran llama.cpp's default attention: flash on, on the CPU measured here.
    v1 = next((r["ttft_p50_s"] for r in old if r["flash_attn"] == "on"), old[0]["ttft_p50_s"] if old else None)
    for r in rows:
        pf = next((x["ttft_p50_s"] for x in rows if x["policy"] == "prefill-first"
                   and x["flash_attn"] == r["flash_attn"]), None)
        r["ttft_x_pf"] = rnd(r["ttft_p50_s"] / pf, 2) if pf else None
        r["ttft_x_v1"] = rnd(r["ttft_p50_s"] / v1, 2) if v1 else None


def _peer_rows(spec: BackendConfig, cfg: BurstConfig, progress) -> list[dict]:
    found = peers.tools_dir()
    if found is None:
        progress("llama-batched-bench is not built (scripts/build_llama_tools.sh): no peer row")
        return []
    bindir, _ = found
    rows = []
    for flash in ("off", "on"):
        def run(ntg: int = cfg.peer_gen) -> tuple[dict, float]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = peers.batched_bench(
                bindir, model=peers.model_path(spec.model), seqs=[cfg.n], prompt=cfg.context,
                gen=ntg, threads=spec.n_threads or 1, n_ctx=spec.n_ctx or 16384, n_batch=2048,
                n_ubatch=spec.n_ubatch, dev=peers.device_args(spec.device), extra=["-pps", "-fa", flash])
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return out, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)

        (out, cpu_short), busy = measured(run, retries=1, progress=progress)
        row = out[cfg.n]
        decode_ms = cfg.n / row["speed_tg"] * 1000 if row.get("speed_tg") else None
        if cfg.cpu_clock:
            # The same prompt twice, 2x the generated tokens the second time: the CPU time that
            # differs is peer_gen decode steps at this depth.
            (_, cpu_long), _ = measured(lambda: run(2 * cfg.peer_gen), retries=0, progress=progress)
            decode_ms = (cpu_long - cpu_short) / cfg.peer_gen * 1000
        rows.append({"flash_attn": flash, "npp": cfg.context, "ntg": cfg.peer_gen, "npl": cfg.n,
                     "pp_tok_s": rnd(row.get("speed_pp"), 1), "tg_tok_s": rnd(row.get("speed_tg"), 1),
                     "decode_step_ms": rnd(decode_ms, 1), "others_cores": rnd(busy, 2)})
        progress(f"llama-batched-bench -fa {flash}: decode step {rows[-1]['decode_step_ms']} ms")
    return rows
