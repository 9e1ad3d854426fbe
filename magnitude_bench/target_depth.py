"""Provides `bench target-depth`: does target:MS hold its step target deep in a context?"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from backend.factory import BackendConfig
from magnitude_bench.common import (
    BenchResult,
    backend_info,
    cpu_clock_for,
    loaded,
    not_quiet_notes,
    prompt_tokens,
    sized,
)
from magnitude_bench.harness import Drive, calibrated, recorded
from scheduler.budget import MIN_PREFILL_QUANTUM, StepShape
from scheduler.cost_model import CostModel
from scheduler.stats import median, percentile, rnd
from scheduler.types import AttentionPath, Request, SamplingParams, attended_kpos

HOLD_RATIO = 1.1  # "p99 step <= 1.1x the target"


@dataclass(frozen=True)
class TargetDepthConfig:
    depths: tuple[int, ...] = (0, 2000, 6000)  # tokens of the conversation the running ones fork from
    n_running: int = 4  # sequences generating when the newcomer arrives
    newcomer: int = 1000  # tokens of the prompt that arrives behind them
    target_ms: float = 50.0  # the target wherever the decode rows plus one quantum fit in it
    # Where they do not, the bench sets the target to this multiple of what they are predicted to
    # take at the newcomer's deepest point: the smallest round target the promise applies to.
    headroom: float = 1.25
    cpu_clock: bool = False  # time steps in CPU seconds of this process (one thread only)


@dataclass
class DepthRun:
    depth: int
    target_ms: float
    need_ms: float  # measured: the decode rows + one quantum at a newcomer-sized prompt's last position
    model_need_ms: float  # what the engine's cost model predicted for that step
    decode_ms: float  # measured: the decode rows alone at this depth
    steps_ms: list[float]  # from the newcomer's arrival to its first token
    prompt_rows: list[int]
    ttft_s: float


def needed_ms(cost: CostModel, path: AttentionPath, decode_rows: int, depth: int, cells: int, newcomer: int) -> float:
    """What `decode_rows` decode rows `depth` deep plus one quantum of the newcomer's prompt, at its
    last position, are predicted to take (`cells`: resident cells once the newcomer is in), the
    step's attention priced as the scheduler prices it (`StepShape.kpos`)."""
    q = MIN_PREFILL_QUANTUM
    shape = StepShape(decode_rows, decode_kpos=decode_rows * attended_kpos(depth, 1),
                      prefill_pos0=max(0, newcomer - q), cells_used=cells, path=path)
    return cost.predict(decode_rows, q, shape.kpos(q))


def run_depth(backend, depth: int, cfg: TargetDepthConfig, params=None) -> DepthRun:
    """N sequences fork from a `depth`-token conversation and generate; a probe of the newcomer's
    length runs one quantum a step beside them (its deepest steps are what the target must hold);
    then the `newcomer`-token prompt arrives and every step until its first token is timed under
    target:MS."""
    q = MIN_PREFILL_QUANTUM
    drive = Drive(backend, policy=f"target:{cfg.target_ms:g}", gen_reserve=4 * cfg.newcomer, params=params,
                  calibrate=False, clock=cpu_clock_for(backend, cfg.cpu_clock),
                  what=f"depth {depth}")
    parent = prompt_tokens(backend, max(depth, 1), salt=3)
    drive.run([Request("parent", "parent", (), SamplingParams(max_tokens=1), prompt_tokens=parent)])
    running = [f"run{i}" for i in range(cfg.n_running)]
    # Enough tokens to outlast the probe's prompt and the newcomer's, each at one quantum a step.
    sampling = SamplingParams(temperature=0.0, max_tokens=2 * (cfg.newcomer // q) + 32)
    drive.submit(*(Request(rid, rid, (), sampling, fork_from="parent",
                           prompt_tokens=parent + prompt_tokens(backend, 8, salt=50 + i)) for i, rid in enumerate(running)))
    drive.until(lambda: all(drive.trace.tokens.get(rid) for rid in running))
    n0 = len(drive.trace.steps)
    drive.until(lambda: len(drive.trace.steps) >= n0 + 8)  # every running sequence generating
    decode = [s.step_ms for s in drive.trace.steps[n0:] if s.decode_rows == cfg.n_running and not s.prefill_rows]
    sched = drive.engine.scheduler
    model_need = needed_ms(sched.cost, sched.attention, cfg.n_running, depth + 24,
                           backend.kv_cells_used() + cfg.newcomer, cfg.newcomer)
    # The probe: a prompt as long as the newcomer's (sharing none of it), one quantum a step.
    drive.engine.set_policy(f"fixed:{q}")
    n0 = len(drive.trace.steps)
    drive.submit(Request("probe", "probe", (), SamplingParams(max_tokens=1),
                         prompt_tokens=prompt_tokens(backend, cfg.newcomer, salt=98)))
    drive.until(lambda: "probe" in drive.trace.done)
    quanta = [s.step_ms for s in drive.trace.steps[n0:] if s.decode_rows == cfg.n_running and s.prefill_rows == q]
    need = median(quanta[-3:])  # the deepest quanta: the newcomer's last steps will cost as much
    decode_ms = median(decode)
    if need is None or decode_ms is None:
        raise RuntimeError(f"depth {depth}: no step ran the {cfg.n_running} decode rows "
                           f"{'alone' if decode_ms is None else f'with a {q}-row quantum'}")
    drive.engine.close_session("probe")
    target = cfg.target_ms if need <= cfg.target_ms else 10.0 * math.ceil(need * cfg.headroom / 10.0)
    drive.engine.set_policy(f"target:{target:g}")
    n0 = len(drive.trace.steps)
    t0 = drive.submit(Request("newcomer", "newcomer", (), SamplingParams(max_tokens=1),
                              prompt_tokens=prompt_tokens(backend, cfg.newcomer, salt=99)))
    drive.until(lambda: bool(drive.trace.tokens.get("newcomer")))
    window = [s for s in drive.trace.steps[n0:] if s.rows]
    ttft = drive.trace.tokens["newcomer"][0] - t0
    drive.close()
    return DepthRun(depth, target, need, model_need, decode_ms, [s.step_ms for s in window],
                    [s.prefill_rows for s in window], ttft)


def _row(r: DepthRun) -> dict:
    p99 = percentile(r.steps_ms, 99)
    assert p99 is not None  # the newcomer's first token took at least one step
    return {"depth": r.depth, "target_ms": r.target_ms, "decode_ms": rnd(r.decode_ms, 1), "need_ms": rnd(r.need_ms, 1),
            "model_need_ms": rnd(r.model_need_ms, 1), "steps": len(r.steps_ms),
            "step_p50_ms": rnd(percentile(r.steps_ms, 50), 1), "step_p99_ms": rnd(p99, 1),
            "step_max_ms": rnd(max(r.steps_ms), 1), "p99_x_target": rnd(p99 / r.target_ms, 3),
            "prompt_rows_p50": percentile(r.prompt_rows, 50), "newcomer_ttft_s": rnd(r.ttft_s, 2),
            "holds": p99 <= HOLD_RATIO * r.target_ms}


@recorded
def run_target_depth(spec: BackendConfig, cfg: TargetDepthConfig, progress=lambda s: None) -> BenchResult:
    res = BenchResult(name="target-depth", title=f"bench target-depth: target:MS with {cfg.n_running} sequences "
                      f"generating and a {cfg.newcomer:,}-token prompt arriving, at depths "
                      f"{', '.join(f'{d:,}' for d in cfg.depths)}",
                      config={"target_depth": asdict(cfg), "backend": asdict(spec)})
    need_cells = max(cfg.depths) + cfg.newcomer * 2 + cfg.n_running * (2 * cfg.newcomer // MIN_PREFILL_QUANTUM + 64)
    spec = sized(spec, cells=need_cells, seqs=cfg.n_running + 2)
    with loaded(spec) as backend:
        params = calibrated(backend, cpu_clock_for(backend, cfg.cpu_clock))
        rows, traces = [], {}
        for depth in cfg.depths:
            run = run_depth(backend, depth, cfg, params)
            traces[str(depth)] = {"step_ms": [rnd(x, 1) for x in run.steps_ms], "prompt_rows": run.prompt_rows}
            rows.append(_row(run))
            progress(f"depth {depth:>5}: target {rows[-1]['target_ms']:g} ms, step p50 {rows[-1]['step_p50_ms']} "
                     f"p99 {rows[-1]['step_p99_ms']} ms ({rows[-1]['p99_x_target']}x)")
        res.tables["step time against the target, per depth"] = rows
        res.data = {"backend": backend_info(backend, params), "steps": traces}
    res.notes += [
        f"need_ms: measured, the step holding the {cfg.n_running} decode rows and one {MIN_PREFILL_QUANTUM}-row "
        "quantum at the last position of a newcomer-sized probe prompt (run one quantum a step before the "
        "newcomer arrives; median of its last 3 such steps); model_need_ms: the engine's cost model's "
        "prediction for that step; decode_ms: measured, the decode rows alone at this depth",
        f"target_ms: {cfg.target_ms:g} where need_ms fits in it, else {cfg.headroom:g}x need_ms rounded up to "
        "10 ms: the promise is for targets the decode rows and a quantum fit in",
        "steps: every step from the newcomer's arrival to its first token; holds: p99 <= "
        f"{HOLD_RATIO:g}x target",
    ]
    if cfg.cpu_clock:
        res.notes.append("times are CPU seconds of the engine's process (one thread: every step computes on it)")
    res.notes += not_quiet_notes()
    return res
