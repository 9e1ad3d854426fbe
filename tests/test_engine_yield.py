"""Tests that agents' decode rows yield to a person's prompt in prefill, within a hold bound (issue 26, defect 6)."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from backend.simulated import SimulatedBackend
from magnitude_bench.person import PersonConfig, run_person
from magnitude_tui.engine.core import Engine
from scheduler.budget import IDLE_MERGE_MS
from scheduler.types import Priority, Request, SamplingParams
from scheduler.yielding import AGENT_HOLD_MS
from tests.engine_driver import close_and_assert_empty


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


@pytest.mark.parametrize("profile", ["cpu2core", "cpu2core-deep"])
def test_a_persons_prompt_beside_8_agents_reaches_its_first_token_within_1_3x_alone(profile):
    res = run_person(BackendConfig(kind=f"simulated:{profile}"), PersonConfig())
    rows = {r["mode"]: r for r in next(iter(res.tables.values()))}
    assert rows["agents yield"]["x_alone"] <= 1.3, rows
    assert rows["agents never yield"]["x_alone"] > 1.5, rows  # what the engine did before
    assert rows["agents yield"]["yielded_rows"] > 0
    # No agent is held longer than the bound plus the one step that follows it.
    assert rows["agents yield"]["agent_max_gap_s"] <= (AGENT_HOLD_MS + 1.1 * IDLE_MERGE_MS) / 1000.0


def test_the_sequences_see_who_yields_and_a_persons_own_stream_never_does():
    backend = SimulatedBackend("cpu2core", n_ctx=32768, n_seq_max=8, n_batch=2048)
    engine = Engine(backend, policy="target:50", coalesce_ms=0)
    engine.submit(Request("agent", "agent", (), SamplingParams(max_tokens=10_000),
                          prompt_tokens=tuple(range(100, 164)), priority=Priority.AGENT))
    engine.submit(Request("me1", "me1", (), SamplingParams(max_tokens=10_000),
                          prompt_tokens=tuple(range(200, 264)), priority=Priority.INTERACTIVE))
    while not any(u.request_id == "agent" and u.new_tokens for r in [engine.step()] if r for u in r.updates):
        pass
    engine.submit(Request("me2", "me2", (), SamplingParams(max_tokens=1),
                          prompt_tokens=tuple(300 + i % 500 for i in range(1500)), priority=Priority.INTERACTIVE))
    report = None
    while report is None or not report.yielded_rows:
        report = engine.step()
    flags = {u.request_id: u.yielding for u in report.updates}
    assert flags.get("agent") is True and report.yielded_rows == 1
    assert report.decode_rows == 1  # the person's other stream kept its row
    seen_after = []
    while not any(u.request_id == "me2" and u.ttft_ms for u in seen_after):
        r = engine.step()
        seen_after += r.updates if r else []
    assert any(u.request_id == "agent" and u.yielding is False for u in seen_after)  # given back
    for rid in ("agent", "me1"):
        engine.cancel(rid)
    engine.run_until_idle()
    close_and_assert_empty(engine, "agent", "me1", "me2")
