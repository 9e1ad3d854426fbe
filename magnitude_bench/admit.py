"""Provides `bench admit`: N sequences generating when one long prompt arrives, every policy side by side."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Callable

from backend.factory import BackendConfig
from magnitude_bench.common import OTHERS_NOTE, BenchResult, backend_info, loaded, measured, prompt_tokens
from magnitude_bench.harness import Drive, recorded
from scheduler.budget import MIN_PREFILL_QUANTUM
from scheduler.stats import median, percentile, rnd
from scheduler.types import Request, SamplingParams

DEFAULT_FIXED = (16, 32, 64, 128, 256, 512, 2048)
TARGET_MULTIPLES = (1.5, 2.0, 3.0)  # auto targets: these multiples of the undisturbed decode step
REAL_N_CTX = 16384  # KV cells for the real-model run unless --ctx says otherwise
KEEP_RATIO = 0.5  # "running sequences keep at least half of their undisturbed tok/s"
TTFT_RATIO = 1.6  # "... while the newcomer's TTFT stays within ~1.6x of prefill-first's"


@dataclass(frozen=True)
class AdmitConfig:
    n_running: int = 8
    running_prompt: int = 32  # tokens per running sequence's own prompt
    # The running sequences fork from one conversation this many tokens long (0: none), so they
    # decode deep in a context, as subagents do; the newcomer arrives behind them.
    running_depth: int = 0
    warmup_tokens: int = 8  # each running sequence has generated this many before the arrival
    newcomer_tokens: int = 0  # 0: 8,000 on a simulated profile, else the most the context allows
    newcomer_gen: int = 4
    fixed: tuple[int, ...] = DEFAULT_FIXED
    targets: tuple[float, ...] = ()  # empty: TARGET_MULTIPLES x the measured undisturbed step
    prefill_first: bool = True


@dataclass
class Trace:
    """What one policy run saw: token times per request and every step (t_end, decode, prefill)."""

    t_arrival: float
    t_first: float
    t_done: float
    tokens: dict[str, list[float]]
    steps: list[tuple[float, int, int]]
    i_arrival: int
    i_first: int
    running_ids: list[str]


def auto_newcomer(cfg: AdmitConfig, backend, simulated: bool) -> int:
    """The issue's scenario length: 8,000 on a simulated profile; on a real model the longest
    prompt that fits beside the running sequences (which must outlast the smallest chunking of it)."""
    if cfg.newcomer_tokens:
        return cfg.newcomer_tokens
    room = (min(backend.n_ctx, backend.n_ctx_seq) - 64 - cfg.newcomer_gen
            - cfg.running_depth)
    per_seq = cfg.running_prompt + cfg.warmup_tokens + 16
    q = _smallest_chunk(cfg)
    # L + N * (per_seq + L/q) <= room
    limit = (room - cfg.n_running * per_seq) / (1 + cfg.n_running / q)
    want = 8000 if simulated else 6000
    return max(64, int(min(want, limit) // 250 * 250))


def _smallest_chunk(cfg: AdmitConfig) -> int:
    """The fewest prompt rows a window step can hold: the smallest fixed:N, or target:MS's quantum."""
    return min((MIN_PREFILL_QUANTUM, *cfg.fixed))


def tail_tokens(newcomer: int, cfg: AdmitConfig) -> int:
    """Tokens each running sequence makes after the arrival: enough to outlast the slowest
    admission (the smallest chunk every step)."""
    return math.ceil(newcomer / _smallest_chunk(cfg)) + 16


def run_policy(backend, policy: str, cfg: AdmitConfig, newcomer: int, tail: int) -> Trace:
    """Start N generating sequences, let them warm up, submit the newcomer, run everything out."""
    # target:MS needs the cost model of this backend (a profile: read, not timed).
    drive = Drive(backend, policy=policy, gen_reserve=cfg.warmup_tokens + tail, calibrate=True)
    running = [f"run{i}" for i in range(cfg.n_running)]
    submit_running(drive, backend, cfg, running, SamplingParams(temperature=0.0, max_tokens=cfg.warmup_tokens + tail))
    tokens, n0 = drive.trace.tokens, len(drive.trace.steps)  # after the context's turn, if any

    def steps() -> list[tuple[float, int, int]]:
        return [(s.t, s.decode_rows, s.prefill_rows) for s in drive.trace.steps[n0:] if s.rows]

    drive.until(lambda: all(len(tokens[r]) >= cfg.warmup_tokens for r in running))
    i_arrival = len(steps())
    t_arrival = drive.submit(Request(request_id="newcomer", session_id="newcomer", messages=(),
                                     sampling=SamplingParams(temperature=0.0, max_tokens=cfg.newcomer_gen),
                                     prompt_tokens=prompt_tokens(backend, newcomer, salt=1000)))
    drive.until(lambda: bool(tokens["newcomer"]))
    t_first, i_first = tokens["newcomer"][0], len(steps())
    drive.run_out()
    drive.close()
    done = steps()
    return Trace(t_arrival, t_first, done[-1][0], {k: tokens[k] for k in [*running, "newcomer"]}, done, i_arrival,
                 i_first, running)


def submit_running(drive: Drive, backend, cfg: AdmitConfig, ids: list[str], sampling: SamplingParams) -> None:
    """The running sequences: each its own short prompt, forked from a `running_depth`-token
    conversation (its turn runs first) when there is one."""
    context: tuple[int, ...] = ()
    if cfg.running_depth:
        context = prompt_tokens(backend, cfg.running_depth, salt=4242)
        drive.submit(Request("context", "context", (), SamplingParams(max_tokens=1), prompt_tokens=context))
        drive.run_out()
    drive.submit(*(Request(request_id=rid, session_id=rid, messages=(), sampling=sampling,
                           fork_from="context" if context else None,
                           prompt_tokens=context + prompt_tokens(backend, cfg.running_prompt, salt=i + 1))
                   for i, rid in enumerate(ids)))


def undisturbed(backend, cfg: AdmitConfig) -> float:
    """Median time between tokens of N sequences generating with nobody arriving (seconds)."""
    drive = Drive(backend, policy="prefill-first")
    ids = [f"u{i}" for i in range(cfg.n_running)]
    submit_running(drive, backend, cfg, ids, SamplingParams(temperature=0.0, max_tokens=24))
    drive.run_out()
    drive.close()
    gaps = [b - a for rid in ids for ts in [drive.trace.tokens[rid]] for a, b in zip(ts[4:], ts[5:])]  # skip the first steps
    return median(gaps) or float("nan")


def summarize(policy: str, tr: Trace) -> dict:
    """The row the table shows for one policy (times in seconds unless the name says ms)."""
    window = tr.steps[tr.i_arrival:tr.i_first]
    rates, gaps = [], []
    for rid in tr.running_ids:
        ts = tr.tokens.get(rid, [])
        end = min(tr.t_first, ts[-1]) if ts else tr.t_first
        n_in = sum(1 for t in ts if tr.t_arrival < t <= tr.t_first)
        rates.append(n_in / (end - tr.t_arrival) if end > tr.t_arrival else 0.0)
        gaps += [(b - a) * 1000 for a, b in zip(ts, ts[1:]) if b > tr.t_arrival and a < tr.t_first]
    prefill_steps = [p for _, _, p in window if p]  # the chunk: median prompt rows per step
    return {
        "policy": policy,
        "chunk": rnd(median(prefill_steps), 1) if prefill_steps else None,
        "running_tok_s": rnd(sum(rates) / len(rates)),
        "keep": None,  # filled in against the undisturbed rate
        "itl_p50_ms": rnd(percentile(gaps, 50), 1),
        "itl_p99_ms": rnd(percentile(gaps, 99), 1),
        "itl_max_ms": rnd(max(gaps) if gaps else None, 1),
        "ttft_s": rnd(tr.t_first - tr.t_arrival, 3),
        "window_step_ms": rnd((tr.t_first - tr.t_arrival) * 1000 / max(len(window), 1), 1),
        "total_s": rnd(tr.t_done - tr.t_arrival, 3),
        "steps": len(tr.steps) - tr.i_arrival,
        "window_steps": len(window),
        "_decode_steps": sum(1 for _, d, _ in window if d),
        "_prefill_rows": sum(p for _, _, p in window),
    }


def add_model(rows: list[dict], base_step: float, rate: float | None) -> None:
    """The cost-model arithmetic beside each measurement: every window step costs the decode step
    (if it has decode rows) plus its prompt rows at the prefill rate, so
    running tok/s = 1 / (decode step + chunk / prefill rate) and the wait = steps x step time."""
    for r in rows:
        d, p = r.pop("_decode_steps"), r.pop("_prefill_rows")
        if not rate:
            r["model_tok_s"] = r["model_ttft_s"] = None
            continue
        wait = d * base_step + p / rate
        r["model_tok_s"] = rnd(d / wait if wait else 0.0)
        r["model_ttft_s"] = rnd(wait, 3)


def judge(rows: list[dict], base_tok_s: float) -> None:
    """Mark which policies meet both halves of the trade-off the issue asks for."""
    pf = next((r["ttft_s"] for r in rows if r["policy"] == "prefill-first"), None)
    for r in rows:
        r["ttft_x_pf"] = rnd(r["ttft_s"] / pf, 2) if pf else None
        # When a step costs its decode part plus its prompt part, the window's time splits between
        # the two: keeping a share k of the running rate leaves 1 - k for the prompt, so no policy
        # can get the newcomer its first token sooner than prefill-first's TTFT / (1 - k).
        keep = min(r["running_tok_s"] / base_tok_s, 0.99)
        r["ttft_x_bound"] = rnd(r["ttft_s"] / (pf / (1.0 - keep)), 2) if pf else None
        ok_keep = r["running_tok_s"] >= KEEP_RATIO * base_tok_s
        ok_ttft = pf is not None and r["ttft_s"] <= TTFT_RATIO * pf
        r["meets"] = "both" if ok_keep and ok_ttft else "keep" if ok_keep else "ttft" if ok_ttft else "-"


def run_admit(spec: BackendConfig, cfg: AdmitConfig, *,
              progress: Callable[[str], None] = lambda s: None) -> tuple[dict, dict]:
    """Every policy on one backend. Returns (summary for the result, raw series for the plot)."""
    if not spec.simulated and spec.n_ctx is None:
        # Room for a ~5,000-token newcomer beside 8 sequences that outlast its slowest admission
        # (positions per sequence stay within the model's trained 8k context; the cells are shared).
        spec = replace(spec, n_ctx=REAL_N_CTX)
    with loaded(spec) as backend:
        newcomer = auto_newcomer(cfg, backend, spec.simulated)
        tail = tail_tokens(newcomer, cfg)

        def guard(fn):  # real hardware: measure on a quiet machine, again if a neighbour got busy
            return (fn(), 0.0) if spec.simulated else measured(fn, retries=4, progress=progress)

        base_step, _ = guard(lambda: undisturbed(backend, cfg))
        targets = cfg.targets or tuple(round(m * base_step * 1000, 1) for m in TARGET_MULTIPLES)
        policies = (["prefill-first"] if cfg.prefill_first else []) + [f"fixed:{n}" for n in cfg.fixed]
        policies += [f"target:{t:g}" for t in targets]
        progress(f"{backend.name}: undisturbed step {base_step * 1000:.1f} ms; newcomer {newcomer:,} "
                 f"tokens; {len(policies)} policies")
        rows, series = [], {}
        rate = (1000.0 / backend.profile.prefill_ms) if spec.simulated else None
        for policy in policies:
            tr, busy = guard(lambda: run_policy(backend, policy, cfg, newcomer, tail))
            row = summarize(policy, tr)
            row["others_cores"] = rnd(busy, 2)
            row["keep"] = rnd(row["running_tok_s"] * base_step, 3)
            rows.append(row)
            series[policy] = {"t_arrival": tr.t_arrival, "t_first": tr.t_first,
                              "tokens": {k: [rnd(t - tr.t_arrival, 4) for t in v] for k, v in tr.tokens.items()}}
            if policy == "prefill-first" and rate is None and row["ttft_s"]:
                rate = newcomer / row["ttft_s"]  # real hardware: the prefill rate prefill-first saw
            progress(f"  {policy:>14}: running {row['running_tok_s']} tok/s, TTFT {row['ttft_s']} s, "
                     f"{row['steps']} steps")
        add_model(rows, base_step, rate)
        judge(rows, 1.0 / base_step)
        summary = {
            "backend": backend_info(backend), "newcomer_tokens": newcomer, "tail_tokens": tail,
            "undisturbed_step_ms": rnd(base_step * 1000, 2), "undisturbed_tok_s": rnd(1.0 / base_step),
            "prefill_rate_tok_s": rnd(rate, 1), "targets_ms": list(targets), "rows": rows,
        }
        if spec.simulated:
            summary["profile"] = asdict(backend.profile)
        return summary, series


@recorded
def admit_result(specs: list[BackendConfig], cfg: AdmitConfig, progress=lambda s: None) -> BenchResult:
    result = BenchResult(name="admit", title="bench admit: one long prompt arrives while N sequences generate",
                         config={"admit": asdict(cfg), "backends": [asdict(s) for s in specs]})
    # Simulated profiles first: seconds, and their table survives a failure of the long real run.
    for spec in sorted(specs, key=lambda s: not s.simulated):
        try:
            summary, _ = run_admit(spec, cfg, progress=progress)
        except Exception as e:  # one backend failing must not discard the others' results
            progress(f"{spec.kind}: failed: {e}")
            result.notes.append(f"{spec.kind}: the run failed: {e}")
            continue
        label = summary["backend"]["backend"]
        result.tables[f"{label}, newcomer {summary['newcomer_tokens']:,} tokens, "
                      f"{cfg.n_running} running (undisturbed {summary['undisturbed_tok_s']} tok/s each)"] = summary["rows"]
        result.data[label] = summary
        result.notes.append(
            f"{label}: decode step {summary['undisturbed_step_ms']} ms with {cfg.n_running} sequences, prefill "
            f"{summary['prefill_rate_tok_s']} tok/s; model columns = that arithmetic, per window step")
    result.notes.append(OTHERS_NOTE)
    result.notes.append(f"keep = running tok/s / undisturbed; ttft_x_pf = TTFT / prefill-first TTFT; meets: "
                        f"keep >= {KEEP_RATIO} and/or TTFT <= {TTFT_RATIO}x prefill-first")
    result.notes.append("ttft_x_bound = TTFT / (prefill-first TTFT / (1 - keep)): where step time is decode time plus "
                        "prompt time, keeping a share `keep` of the running rate leaves 1 - keep of the machine to the "
                        "newcomer, so 1.0 is the best any policy can do at that keep (below 1.0: the mixed steps cost "
                        f"less than their parts). Hence keep >= {KEEP_RATIO} implies TTFT >= {1 / (1 - KEEP_RATIO):g}x "
                        "prefill-first on such hardware")
    return result
