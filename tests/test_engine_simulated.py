"""The engine on the simulated RX 9070 XT: measured (virtual-clock) behaviour vs the cost model."""

from __future__ import annotations

import math

import pytest

from backend.factory import BackendConfig, build_backend
from backend.simulated import PROFILES, HardwareProfile, SimulatedBackend, VirtualClock, get_profile
from magnitude_tui.engine.core import Engine
from scheduler.budget import GAP_SLACK, MIN_PREFILL_QUANTUM
from scheduler.cost_model import CostParams
from scheduler.types import Phase, Request, SamplingParams
from tests.engine_driver import close_and_assert_empty

N_RUNNING = 8
N_PROMPT = 8000
RX = PROFILES["rx9070xt"]


def _req(rid: str, n: int, max_tokens: int = 100_000) -> Request:
    return Request(rid, f"s-{rid}", (), SamplingParams(max_tokens=max_tokens),
                   prompt_tokens=tuple(100 + (i % 500) for i in range(n)))


def _admission(policy: str) -> dict:
    """8 sequences generating; one 8,000-token prompt arrives. Returns what the engine measured."""
    backend = SimulatedBackend("rx9070xt", n_ctx=65536, n_seq_max=16, n_batch=8192)
    engine = Engine(backend, policy=policy, coalesce_ms=0)
    for i in range(N_RUNNING):
        engine.submit(_req(f"run{i}", 16))
    token_times: dict[str, list[float]] = {f"run{i}": [] for i in range(N_RUNNING)}

    def record(report):
        for u in report.updates:
            if u.request_id in token_times and u.new_tokens:
                token_times[u.request_id].append(report.t)

    phases: dict[str, Phase] = {}
    while any(phases.get(f"run{i}") is not Phase.GENERATING for i in range(N_RUNNING)):
        report = engine.step()
        record(report)
        phases.update((u.request_id, u.phase) for u in report.updates)
    for _ in range(3):  # settle into steady decode
        record(engine.step())

    t_arrival = backend.clock()
    engine.submit(_req("new", N_PROMPT, max_tokens=1))
    ttft = None
    while ttft is None:
        report = engine.step()
        record(report)
        for u in report.updates:
            if u.request_id == "new" and u.ttft_ms is not None:
                ttft = u.ttft_ms / 1000.0
    t_first = backend.clock()
    record(engine.step())  # the running sequences' first token after the newcomer's prompt
    gaps = [b - a for ts in token_times.values() for a, b in zip(ts, ts[1:])]
    rates = [sum(1 for t in ts if t_arrival < t <= t_first) / (t_first - t_arrival)
             for ts in token_times.values()]
    for i in range(N_RUNNING):
        engine.cancel(f"run{i}")
    engine.run_until_idle()
    close_and_assert_empty(engine, *(f"s-run{i}" for i in range(N_RUNNING)), "s-new")
    return {"ttft_s": ttft, "rates": rates, "max_gap_s": max(gaps), "gaps": gaps}


def test_fixed_32_shares_every_step_between_decode_and_the_newcomer():
    got = _admission("fixed:32")
    step_ms = RX.step_ms(N_RUNNING, 32)  # 25.7 ms of decode + 32 prompt rows at 962 tok/s
    expected_ttft = math.ceil(N_PROMPT / 32) * step_ms / 1000.0
    assert got["ttft_s"] == pytest.approx(expected_ttft, rel=1e-3)
    assert got["ttft_s"] == pytest.approx(14.7, abs=0.1)  # the figure
    for rate in got["rates"]:
        assert rate == pytest.approx(1000.0 / step_ms, rel=0.01)
        assert rate == pytest.approx(17.0, abs=0.2)
    assert got["max_gap_s"] == pytest.approx(step_ms / 1000.0, rel=1e-3)


def test_prefill_first_stalls_every_running_sequence_for_the_whole_prompt():
    got = _admission("prefill-first")
    prefill_ms = RX.step_ms(0, N_PROMPT)
    assert got["ttft_s"] == pytest.approx(prefill_ms / 1000.0, rel=1e-3)
    # Each running sequence's gap spans the prompt-only step and the next decode step.
    expected_gap = (prefill_ms + RX.step_ms(N_RUNNING + 1, 0)) / 1000.0
    assert got["max_gap_s"] == pytest.approx(expected_gap, rel=1e-3)
    assert N_PROMPT / 962.0 == pytest.approx(8.3, abs=0.05)  # the figure
    assert got["max_gap_s"] > 8.3
    assert all(rate < 0.2 for rate in got["rates"])  # ~1 token in 8.3 s


def test_target_keeps_every_gap_near_the_target_and_admits_the_newcomer():
    got = _admission("target:50")
    rows = math.floor((50 - RX.step_ms(N_RUNNING, 0)) / RX.prefill_ms)
    assert rows == 23
    step_ms = RX.step_ms(N_RUNNING, rows)
    assert step_ms <= 50
    assert got["max_gap_s"] <= 0.050 * 1.01
    assert got["ttft_s"] == pytest.approx(math.ceil(N_PROMPT / rows) * step_ms / 1000.0, rel=1e-3)


def test_a_target_below_the_decode_step_bounds_the_gap_by_the_decode_step_instead():
    got = _admission("target:20")  # 8 decode rows alone take 25.7 ms
    # The step may take (1 + GAP_SLACK) x 25.7 = 51.4 ms: 24 prompt rows beside the decode rows.
    rows = math.floor(GAP_SLACK * RX.step_ms(N_RUNNING, 0) / RX.prefill_ms)
    assert rows == 24 > MIN_PREFILL_QUANTUM
    step_ms = RX.step_ms(N_RUNNING, rows)
    assert got["max_gap_s"] == pytest.approx(step_ms / 1000.0, rel=1e-3)
    assert got["max_gap_s"] <= (1 + GAP_SLACK) * RX.step_ms(N_RUNNING, 0) / 1000.0
    assert got["ttft_s"] == pytest.approx(math.ceil(N_PROMPT / rows) * step_ms / 1000.0, rel=1e-3)


def test_profiles_and_specs():
    assert get_profile("simulated:rx9070xt") is RX
    assert RX.step_ms(8, 0) == pytest.approx(25.7)
    assert 1000.0 / RX.prefill_ms == pytest.approx(962.0)
    cpu = get_profile("cpu2core")
    assert cpu.step_ms(1, 0) == pytest.approx(11.0)
    assert cpu.step_ms(8, 0) == pytest.approx(58.0, abs=0.5)
    with pytest.raises(ValueError, match="rx9070xt"):
        get_profile("simulated:nope")
    backend = build_backend(BackendConfig("simulated:cpu2core", n_ctx=1024))
    assert backend.profile is cpu and backend.n_ctx == 1024
    assert backend.known_costs.fixed_ms == cpu.fixed_ms  # the engine seeds its cost model from it
    assert build_backend(BackendConfig("fake")).name == "fake"
    with pytest.raises(ValueError, match="unknown backend 'gpt'"):
        BackendConfig("gpt")


def test_simulated_time_only_passes_in_steps_and_calibration_reads_the_profile():
    clock = VirtualClock()
    backend = SimulatedBackend("cpu2core", clock=clock, n_ctx=4096, n_batch=512)
    engine = Engine(backend, policy="target:100", coalesce_ms=5)
    assert engine.calibrate().prefill_ms == pytest.approx(1000.0 / 210.0)
    engine.submit(_req("a", 100, max_tokens=3))
    first = engine.step()  # inside the idle coalescing window: reports "preparing", runs no rows
    assert first.decode_rows + first.prefill_rows == 0
    assert [u.phase for u in first.updates] == [Phase.PREPARING]
    assert engine.step() is None  # nothing changed; no time passes by itself
    assert clock() == 0.0
    reports = engine.run_until_idle()
    assert reports[-1].updates[-1].done_reason.value == "length"
    steps = [r for r in reports if r.decode_rows + r.prefill_rows]
    expected = 0.005 + sum(backend.profile.step_ms(r.decode_rows, r.prefill_rows) for r in steps) / 1000
    assert clock() == pytest.approx(expected)
    engine.close_session("s-a")
    engine.run_until_idle()
    assert engine.is_empty()


def test_target_holds_deep_in_a_long_prompt_where_each_row_costs_more():
    # CPU-like: 8 decode rows take 45 ms, and a prompt row costs 3.5 ms plus 0.4 ms per thousand
    # positions it attends. Calibration (near position 0) cannot see the attention term; the engine
    # learns it from the admission's own steps and keeps them near the target as the prompt deepens.
    deep = HardwareProfile("deep", fixed_ms=5.0, decode_ms=5.0, prefill_ms=3.5, attn_ms=0.4)
    backend = SimulatedBackend(deep, n_ctx=65536, n_seq_max=16, n_batch=2048)
    engine = Engine(backend, policy="target:200", coalesce_ms=0)
    engine.scheduler.cost.seed(CostParams(5.0, 5.0, 3.5))  # as a calibration near position 0 saw it
    assert engine.cost.attn_ms == 0.0
    for i in range(8):
        engine.submit(_req(f"run{i}", 16))
    for _ in range(5):
        engine.step()
    engine.submit(_req("new", 5000, max_tokens=1))
    window = []
    while True:
        report = engine.step()
        window.append(report)
        if any(u.request_id == "new" and u.ttft_ms is not None for u in report.updates):
            break
    steady = [r.step_ms for r in window[20:]]
    within = sum(ms <= 200 * 1.1 for ms in steady) / len(steady)
    assert within >= 0.9, sorted(steady)[-10:]
    assert engine.cost.attn_ms > 0.1  # learned, though shared with the per-row cost it fits beside
    # The last chunks, deep in the prompt, are smaller than the first ones, and above the floor.
    chunks = [r.prefill_rows for r in window if r.decode_rows]
    assert MIN_PREFILL_QUANTUM < chunks[-2] < chunks[2]
