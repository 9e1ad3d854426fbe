"""Budget policies, the online cost model, per-request metrics, and the scheduler's purity."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.budget import (
    GAP_SLACK,
    IDLE_MERGE_MS,
    IDLE_STEP_MS,
    MIN_PREFILL_QUANTUM,
    TILE_STRETCH,
    StepShape,
    parse_policy,
    whole_tiles,
    within_cache,
)
from scheduler.cost_model import CostModel, CostParams
from scheduler.metrics import RequestMetrics
from scheduler.types import AttentionPath, attended_kpos

RX = CostParams(fixed_ms=14.6, decode_ms=1.3875, prefill_ms=1000.0 / 962.0)


def test_scheduler_imports_neither_llama_cpp_nor_textual():
    code = (
        "import sys, scheduler, scheduler.planner, scheduler.admission, scheduler.residency, "
        "scheduler.relief, scheduler.ledger, scheduler.budget, scheduler.metrics, "
        "scheduler.sequence, scheduler.types, backend.fake, backend.simulated\n"
        "bad = [m for m in ('llama_cpp', 'textual') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


def test_the_scheduler_imports_nothing_of_the_app_or_its_engine():
    """The wire types (SeqUpdate, StepReport...) are the engine's (magnitude_tui/engine/events.py);
    the pure scheduler below it imports none of magnitude_tui."""
    import pkgutil

    import scheduler

    names = [f"scheduler.{m.name}" for m in pkgutil.iter_modules(scheduler.__path__)]
    code = f"import sys, {', '.join(names)}\nbad = sorted(m for m in sys.modules if m.startswith('magnitude_tui'))\n" \
           "assert not bad, bad\n"
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


@pytest.mark.parametrize("text,expected", [
    ("prefill-first", "prefill-first"), ("fixed:32", "fixed:32"), (" FIXED:8 ", "fixed:8"),
    ("target:50", "target:50"), ("target:12.5", "target:12.5"),
])
def test_policies_parse_and_print_back(text, expected):
    assert str(parse_policy(text)) == expected


@pytest.mark.parametrize("text", ["", "fifo", "fixed", "fixed:0", "fixed:-3", "fixed:x",
                                  "target:0", "target:nan", "target:"])
def test_bad_policies_say_what_is_accepted(text):
    with pytest.raises(ValueError, match="target:MS"):
        parse_policy(text)


def _shape(decode_rows: int, n_batch: int = 2048, **kw) -> StepShape:
    return StepShape(decode_rows=decode_rows, n_batch=n_batch, **kw)


def test_policy_allowances():
    cost = CostModel(RX)
    assert parse_policy("fixed:32").prefill_allowance(_shape(8), cost) == 32
    assert parse_policy("fixed:32").prefill_allowance(_shape(8, 20), cost) == 12  # never past n_batch
    assert parse_policy("prefill-first").prefill_allowance(_shape(8), cost) == 2048
    # (50 - 25.7) ms / 1.0395 ms per prompt row = 23.4 -> 23 rows beside 8 decode rows.
    assert parse_policy("target:50").prefill_allowance(_shape(8), cost) == 23
    # Under 10 ms the 8 decode rows (25.7 ms) cannot run at all: the step may take twice the
    # decode-only step instead, (51.4 - 25.7) / 1.0395 = 24.7 rows.
    assert GAP_SLACK == 1.0
    assert parse_policy("target:10").prefill_allowance(_shape(8), cost) == 24
    # The policy before depth awareness gave the 16-row floor there.
    assert parse_policy("target-v1:10").prefill_allowance(_shape(8), cost) == MIN_PREFILL_QUANTUM
    assert str(parse_policy("target-v1:50")) == "target-v1:50"


def test_an_unreachable_target_bounds_the_gap_by_the_decode_only_step():
    # 2 CPU cores at depth: 11 decode rows take 400 ms; a prompt row costs 5 ms.
    cost = CostModel(CostParams(fixed_ms=20.0, decode_ms=34.5, prefill_ms=5.0))
    decode_only = cost.predict(11, 0)
    rows = parse_policy("target:50").prefill_allowance(_shape(11), cost)
    assert rows == int(decode_only * GAP_SLACK / 5.0)  # 399.5 ms of prompt rows beside them
    assert cost.predict(11, rows) <= (1 + GAP_SLACK) * decode_only < cost.predict(11, rows + 1)
    # Where one quantum still fits, the target stands.
    assert parse_policy("target:50").prefill_allowance(_shape(0), CostModel(RX)) >= 23


def test_an_unreachable_target_fills_the_attention_tile_rather_than_running_rows_one_at_a_time():
    # 1 CPU thread, flash attention at depth 2,200: a 16-row floor beside 4 decode rows would run
    # the whole step one row at a time; the backend's 64-row tile costs less. A tiled step runs its
    # decode rows in a call of their own, so the prompt fills the tile alone: 64 prompt rows.
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=8.0, prefill_ms=6.0, attn_ms=10.0))
    deep = dict(decode_kpos=4 * 2.2, prefill_pos0=2100, n_batch=2048)
    assert parse_policy("target:50").prefill_allowance(StepShape(4, **deep), cost) == MIN_PREFILL_QUANTUM
    assert parse_policy("target:50").prefill_allowance(StepShape(4, **deep, tile_rows=64), cost) == 64
    # More decode rows than the tile: their gap bound already gives the prompt more than a tile.
    wide = StepShape(70, decode_kpos=70 * 2.2, prefill_pos0=2100, tile_rows=64)
    assert (parse_policy("target:50").prefill_allowance(wide, cost)
            == parse_policy("target:50").prefill_allowance(replace(wide, tile_rows=0), cost) > 64)
    # Shallow decode rows that fit the target, beside a newcomer whose quantum does not: the gap
    # bound stands (the tile would double the running sequences' gap, as seen on 2 threads).
    shallow = StepShape(4, decode_kpos=4 * 0.1, prefill_pos0=2100, n_batch=2048, tile_rows=64)
    assert cost.predict(4, 0, shallow.kpos(0)) < 200 < cost.predict(4, 16, shallow.kpos(16))
    assert (parse_policy("target:200").prefill_allowance(shallow, cost)
            == parse_policy("target:200").prefill_allowance(replace(shallow, tile_rows=0), cost) < 60)
    # A target that holds is left alone: the tile matters only where the target is out of reach.
    near = StepShape(2, decode_kpos=0.02, prefill_pos0=10, tile_rows=64)
    assert parse_policy("target:500").prefill_allowance(near, cost) == cost.rows_within(500, near)


def test_target_aims_below_its_target_by_how_far_steps_overran_their_prediction():
    # A step runs 10 % over the model on average and +-15 % around that (a loaded machine, a
    # context deepening faster than the fit follows): aiming at MS itself puts the tail well over it.
    prior = CostParams(fixed_ms=8.0, decode_ms=9.0, prefill_ms=7.0, attn_ms=2.0)
    shape = StepShape(4, decode_kpos=4 * 2.0, prefill_pos0=2000, n_batch=2048)
    policy = parse_policy("target:300")

    def run() -> list[float]:
        rng = random.Random(7)
        cost, steps = CostModel(prior), []
        for _ in range(300):
            rows = policy.prefill_allowance(shape, cost)
            truth = 1.1 * prior.predict(4, rows, shape.kpos(rows)) * rng.uniform(0.85, 1.15)
            cost.observe(4, rows, truth, shape.kpos(rows))
            steps.append(truth)
        return steps[100:]

    steps = run()
    assert sorted(steps)[int(0.99 * len(steps))] <= 1.1 * 300
    assert sorted(steps)[len(steps) // 2] >= 0.8 * 300  # not by giving up the prompt rows
    assert CostModel(prior).overrun() == 1.0  # no steps yet: no margin


def test_cost_model_recovers_the_hardware_from_measured_steps():
    rng = random.Random(1)
    model = CostModel(CostParams(5.0, 1.0, 1.0))
    for _ in range(200):
        d, p = rng.randint(0, 16), rng.choice([0, 0, 8, 32, 128, 512])
        if d + p:
            model.observe(d, p, RX.predict(d, p) * rng.uniform(0.97, 1.03))
    got = model.params
    assert got.fixed_ms == pytest.approx(RX.fixed_ms, rel=0.15)
    assert got.decode_ms == pytest.approx(RX.decode_ms, rel=0.15)
    assert got.prefill_ms == pytest.approx(RX.prefill_ms, rel=0.05)


def test_cost_model_stays_sane_when_every_step_looks_alike():
    model = CostModel(RX)
    for _ in range(100):
        model.observe(8, 23, RX.predict(8, 23) * 1.2)  # the machine got 20% slower
    assert model.predict(8, 23) == pytest.approx(RX.predict(8, 23) * 1.2, rel=0.02)
    assert all(v > 0 for v in (model.params.decode_ms, model.params.prefill_ms))
    model.observe(8, 0, float("nan"))
    model.observe(0, 0, 5.0)
    model.observe(8, 0, 0.0)
    assert len(model._samples) == 100


def test_request_metrics_from_timestamps():
    m = RequestMetrics(t_submit=1.0)
    m.on_admit(1.1)
    m.on_scheduled(1.2)
    m.on_scheduled(9.0)  # only the first counts
    for t in (2.0, 2.1, 2.2, 2.5, 2.6):
        m.on_token(t)
    assert m.queue_ms == pytest.approx(200.0)
    assert m.ttft_ms == pytest.approx(1000.0)
    assert m.itl_p50_ms == pytest.approx(100.0)
    assert m.itl_max_ms == pytest.approx(300.0)
    assert m.itl_p95_ms == pytest.approx(300.0)
    assert m.final_tok_s == pytest.approx(4 / 0.6)
    assert m.live_tok_s(2.6) == pytest.approx(4 / 0.6)
    assert m.live_tok_s(10.0) == 0.0  # a stall shows in the live rate
    assert RequestMetrics(t_submit=0.0).live_tok_s(1.0) is None


def test_cost_model_follows_a_noisy_slowdown_without_running_away():
    rng = random.Random(3)
    model = CostModel(RX)
    for i in range(400):  # a few varied steps, then identical ones on a contended machine
        d, p = (rng.randint(0, 8), rng.choice([0, 16, 64])) if i < 10 else (8, 23)
        model.observe(d, p, RX.predict(d, p) * rng.uniform(0.5, 3.0))
    assert 1.2 * RX.prefill_ms < model.params.prefill_ms < 3 * RX.prefill_ms
    assert RX.decode_ms / 10 <= model.params.decode_ms <= RX.decode_ms * 10
    assert model.predict(8, 23) == pytest.approx(1.75 * RX.predict(8, 23), rel=0.15)


def test_a_pinned_intercept_refits_the_slopes():
    # Measured on a busy machine: the prompt rows' cost grows faster than linearly, which an
    # unconstrained fit answers with a negative intercept.
    model = CostModel(CostParams(5.0, 1.0, 1.0), anchor=0.01, row_cost_range=None)
    for d, p, ms in [(0, 16, 64.3), (0, 48, 157.3), (0, 96, 415.7), (1, 0, 7.7), (2, 0, 13.9),
                     (3, 0, 17.5), (4, 0, 20.1)]:
        model.observe(d, p, ms)
    assert model.params.fixed_ms == 0.0
    assert model.predict(0, 48) == pytest.approx(157.3, rel=0.3)
    assert model.predict(4, 0) == pytest.approx(20.1, rel=0.3)
    online = CostModel(CostParams(40.0, 24.8, 18.0))
    for _ in range(100):
        online.observe(0, 16, 100.0)  # every step alike: only their total is known
    assert online.predict(0, 16) == pytest.approx(100.0, rel=0.15)


def test_with_nothing_generating_target_steps_hold_one_micro_batch():
    cost = CostModel(RX)
    target = parse_policy("target:50")
    # Nobody generates: one micro-batch (n_ubatch rows), prefill's efficient unit, not one second.
    assert target.prefill_allowance(_shape(0, n_ubatch=512), cost) == 512
    assert target.prefill_allowance(_shape(0, n_ubatch=256), cost) == 256
    assert target.prefill_allowance(_shape(1), cost) == 32  # someone generates: 50 ms
    assert parse_policy("target:3000").prefill_allowance(_shape(0), cost) == 2048  # a longer target stands
    fast = CostModel(CostParams(fixed_ms=5.0, decode_ms=0.2, prefill_ms=0.05))  # a GPU: 900 rows in 50 ms
    assert target.prefill_allowance(_shape(0), fast) == 900
    assert parse_policy("fixed:32").prefill_allowance(_shape(0), cost) == 32
    # Everything pending at once when that is quick (1,024 rows: 1.08 s): all finish together.
    assert target.prefill_allowance(_shape(0, pending_rows=1024), cost) == 1024
    assert cost.predict(0, 1024) <= IDLE_MERGE_MS < cost.predict(0, 2000)
    assert target.prefill_allowance(_shape(0, pending_rows=2000), cost) == 512


def prefill_rows_within(model: CostModel, target_ms: float, decode_rows: int, decode_kpos: float = 0.0,
                        prefill_pos0: int = 0) -> int:
    """How many prompt rows, starting at position `prefill_pos0`, fit beside `decode_rows` decode
    rows (attending over `decode_kpos` thousand positions) in `target_ms`, from the closed form."""
    p = model.params
    room = target_ms - p.fixed_ms - p.decode_ms * decode_rows - p.attn_ms * decode_kpos
    if room <= 0:
        return 0
    # n rows cost prefill_ms*n + attn_ms*(n*pos0 + n(n+1)/2)/1000: the positive root of
    # a*n^2 + b*n - room, in the form that stays exact as a -> 0.
    a = p.attn_ms / 2000.0
    b = p.prefill_ms + p.attn_ms * (prefill_pos0 + 0.5) / 1000.0
    return int(2.0 * room / (b + math.sqrt(b * b + 4.0 * a * room)))


def test_the_previous_target_policy_ran_up_to_a_second_with_nothing_generating():
    cost = CostModel(RX)  # 962 prompt tok/s: a second holds (1000 - 14.6) / 1.04 = 947 rows
    idle = parse_policy("target-v1:50").prefill_allowance(_shape(0), cost)
    assert idle == prefill_rows_within(cost, IDLE_STEP_MS, 0) == 947
    assert cost.predict(0, idle) <= IDLE_STEP_MS < cost.predict(0, idle + 1)


def test_without_flash_attention_every_resident_cell_costs_every_row():
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=5.0, prefill_ms=3.5, attn_ms=1.0))
    target = parse_policy("target:300")
    flash = _shape(8, decode_kpos=8 * 0.3, prefill_pos0=300)
    dense_empty = _shape(8, cells_used=600, path=AttentionPath.DENSE)
    dense_idle = _shape(8, cells_used=600 + 4000, path=AttentionPath.DENSE)  # idle conversations' KV
    rows = [target.prefill_allowance(s, cost) for s in (flash, dense_empty, dense_idle)]
    assert rows[0] > rows[1] > rows[2] >= MIN_PREFILL_QUANTUM
    # The whole used range, rounded up to llama.cpp's 256-cell padding, for every row.
    assert dense_idle.kpos(10) == pytest.approx(18 * 4864 / 1000)
    for shape, n in zip((flash, dense_empty), rows):
        assert cost.predict(8, n, shape.kpos(n)) <= 300 < cost.predict(8, n + 1, shape.kpos(n + 1))


def test_target_prices_prompt_rows_deep_in_a_long_context():
    # A CPU-like device: each prompt row costs 3.5 ms plus 1.4 ms per thousand positions it attends.
    truth = CostParams(fixed_ms=5.0, decode_ms=5.0, prefill_ms=3.5, attn_ms=1.4)
    model = CostModel(truth)
    shallow = prefill_rows_within(model, 93, 8, prefill_pos0=0)
    deep = parse_policy("target:93").prefill_allowance(_shape(8, prefill_pos0=5000), model)
    assert shallow == 13  # (93 - 45) / 3.5 = 13.7
    assert deep == MIN_PREFILL_QUANTUM  # 3.5 + 1.4 * 5.0 = 10.5 ms a row: 4 fit; the floor is 16
    fits = prefill_rows_within(model, 93, 8, prefill_pos0=5000)
    assert fits == 4
    for pos0, rows in ((0, 13), (5000, fits)):
        kpos = attended_kpos(pos0, rows)
        assert truth.predict(8, rows, kpos) <= 93 < truth.predict(8, rows + 1, attended_kpos(pos0, rows + 1))


def test_cost_model_learns_the_attention_cost_from_steps_deep_in_a_prompt():
    truth = CostParams(fixed_ms=5.0, decode_ms=5.0, prefill_ms=3.5, attn_ms=1.4)
    model = CostModel(CostParams(5.0, 5.0, 3.5))  # calibrated near position 0: no attention term
    rng = random.Random(5)
    pos0 = 0
    while pos0 < 5000:  # one long prompt chunked beside 8 decode rows, as under target:MS
        rows = rng.choice([8, 12, 16])
        kpos = attended_kpos(pos0, rows) + attended_kpos(300, 1) * 8
        model.observe(8, rows, truth.predict(8, rows, kpos) * rng.uniform(0.95, 1.05), kpos)
        pos0 += rows
    assert model.params.attn_ms == pytest.approx(1.4, rel=0.25)
    k = attended_kpos(5000, 6)
    assert model.predict(8, 6, k) == pytest.approx(truth.predict(8, 6, k), rel=0.1)


def test_a_decode_step_slow_for_another_reason_than_attention_does_not_fill_the_tile():
    # A loaded machine: one shallow decode row predicted at 360 ms (over a 50 ms target) and prompt
    # rows at ~50 ms each: a step filled to the 64-row tile would cost ten decode steps (3-7 s were
    # seen), for no kernel's sake.
    cost = CostModel(CostParams(fixed_ms=300.0, decode_ms=60.0, prefill_ms=50.0, attn_ms=10.0))
    shallow = StepShape(1, decode_kpos=0.4, prefill_pos0=300, n_batch=2048, tile_rows=64)
    assert cost.predict(1, 63, shallow.kpos(63)) > TILE_STRETCH * cost.predict(1, 0, shallow.kpos(0))
    allowance = parse_policy("target:50").prefill_allowance(shallow, cost)
    assert allowance == parse_policy("target:50").prefill_allowance(replace(shallow, tile_rows=0), cost) < 63


def test_an_agents_step_takes_whole_attention_tiles_of_a_longer_prompt():
    # With no person pacing the step, a prompt deep in a context was cut into 2-second chunks of
    # 244, 233, 221 rows: the rows of each chunk's partial 64-row tile attend one at a time, and a
    # 2,800-token prompt took 10 % longer than in 256-row chunks. The chunk now ends on a tile.
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=8.0, prefill_ms=6.0, attn_ms=10.0))
    # (A backend whose micro-batch is one tile: the micro-batch floor, tested below, stays out of it.)
    deep = dict(decode_kpos=2.2, prefill_pos0=2100, n_batch=2048, n_ubatch=64, paced=False)
    target = parse_policy("target:50")
    free = target.prefill_allowance(StepShape(1, **deep, pending_rows=5000), cost)
    assert free % 64 != 0  # what fits in the step, as the cost model says
    tiled = target.prefill_allowance(StepShape(1, **deep, pending_rows=5000, tile_rows=64), cost)
    assert tiled == free - free % 64 and tiled > 0
    # The last chunk of a prompt is what is left, and a backend without such a kernel is not cut.
    assert target.prefill_allowance(StepShape(1, **deep, pending_rows=free, tile_rows=64), cost) == free
    assert whole_tiles(free, StepShape(1, **deep, pending_rows=5000)) == free


def test_an_agents_step_never_falls_under_the_attention_tile_where_its_rows_would_run_one_at_a_time():
    # The agent trace on one thread, 6,000-8,800 cells: once 2 s fitted fewer than 64 prompt rows
    # the steps held 63, 59, 56 ... 43 rows at 3.1-4.6 s each (attention one row at a time), where
    # 64-row steps had taken 1.3-2.2 s, and the model fitting them offered fewer still.
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=8.0, prefill_ms=6.0, attn_ms=6.0))
    # (A micro-batch under the tile, so that the tile is the floor here.)
    deep = StepShape(1, decode_kpos=7.0, prefill_pos0=6500, n_batch=2048, n_ubatch=32, paced=False, tile_rows=64,
                     pending_rows=1500)
    target = parse_policy("target:50")
    assert MIN_PREFILL_QUANTUM < cost.rows_within(IDLE_MERGE_MS, deep) < 64
    assert target.prefill_allowance(deep, cost) == 64
    # A rest shorter than the tile is taken whole; a backend without a tile keeps what fits 2 s.
    assert target.prefill_allowance(replace(deep, pending_rows=40), cost) >= 40
    untiled = replace(deep, tile_rows=0)
    assert target.prefill_allowance(untiled, cost) == cost.rows_within(IDLE_MERGE_MS, untiled) < 64


def test_an_agents_step_takes_at_least_one_micro_batch_deep_in_a_context():
    # The agent trace on one thread, serve beside a copy of itself with this floor, both at once
    # on a core each: 0.92-0.96 of its makespan, where 2 s held 100-odd prompt rows 5,000 deep.
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=8.0, prefill_ms=6.0, attn_ms=6.0))
    deep = StepShape(1, decode_kpos=5.0, prefill_pos0=5000, n_batch=2048, n_ubatch=512, paced=False, tile_rows=64,
                     pending_rows=2600)
    target = parse_policy("target:50")
    assert cost.rows_within(IDLE_MERGE_MS, deep) < 512
    assert target.prefill_allowance(deep, cost) == 512
    # A person pacing the step keeps it short; the rest of a prompt under a micro-batch is taken whole.
    assert target.prefill_allowance(replace(deep, paced=True), cost) < 64
    assert target.prefill_allowance(replace(deep, pending_rows=300), cost) >= 300
    # Where more than a micro-batch fits the 2 s (shallow, a fast machine), that many it is.
    fast = CostModel(CostParams(fixed_ms=1.0, decode_ms=1.0, prefill_ms=0.5, attn_ms=0.1))
    shallow = replace(deep, decode_kpos=0.1, prefill_pos0=100)
    assert target.prefill_allowance(shallow, fast) > 1024


def test_an_agents_step_takes_a_short_rest_of_the_prompt_rather_than_leave_it_a_step_of_its_own():
    # What would be left under a tile runs one row at a time in a step of its own (4,500 deep on
    # one thread, 48 rows alone cost 1,455 ms, 48 more beside 64 rows 1,089): the step takes it.
    shape = StepShape(1, decode_kpos=4.5, prefill_pos0=4500, n_batch=2048, paced=False, tile_rows=64)
    assert whole_tiles(150, replace(shape, pending_rows=170)) == 170
    assert whole_tiles(150, replace(shape, pending_rows=192)) == 128  # 64 left: a whole tile
    assert whole_tiles(150, replace(shape, pending_rows=150)) == 150  # the last chunk as it is
    assert whole_tiles(40, replace(shape, pending_rows=70)) == 40  # under a tile: no tile to end on
    # Never more rows than the batch holds.
    assert whole_tiles(150, replace(shape, pending_rows=170, n_batch=160)) == 128


def test_a_dense_step_deep_in_a_pool_keeps_its_attention_scores_in_the_cache():
    # Dense, one thread: 1,000 prompt rows beside 7,400 cells took 18.6-19.2 s in 32-row chunks and
    # 21.5-21.9 s in 128-row ones (the scores of 128 rows no longer stay in the cache).
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=8.0, prefill_ms=5.5, attn_ms=2.0))
    deep = StepShape(1, decode_kpos=4.4, prefill_pos0=3000, n_batch=2048, cells_used=8000, paced=False,
                     pending_rows=3000, path=AttentionPath.DENSE)
    target = parse_policy("target:50")
    free = target.prefill_allowance(deep, cost)  # what fits the agents' step
    assert free > 64
    bounded = target.prefill_allowance(replace(deep, kq_cells=32 * 8192), cost)
    assert bounded == 32 * 8192 // (8000 + 1 + free) < free
    # A shallow pool's scores fit as they are; and never below the quantum.
    shallow = replace(deep, cells_used=500, decode_kpos=0.5, prefill_pos0=400, kq_cells=32 * 8192)
    assert target.prefill_allowance(shallow, cost) == target.prefill_allowance(replace(shallow, kq_cells=0), cost)
    assert within_cache(200, replace(deep, cells_used=10**6, kq_cells=32 * 8192), cost) == MIN_PREFILL_QUANTUM
    # Where a row's own work dominates (a large model), or on flash, the chunk stays as it is.
    heavy = CostModel(CostParams(fixed_ms=50.0, decode_ms=80.0, prefill_ms=200.0, attn_ms=2.0))
    assert within_cache(100, replace(deep, kq_cells=32 * 8192), heavy) == 100
    assert within_cache(100, replace(deep, kq_cells=32 * 8192, path=AttentionPath.FLASH), cost) == 100
