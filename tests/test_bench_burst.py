"""bench burst: subagents forked at once from a long conversation, every policy, both attention paths."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_bench.burst import BurstConfig, run_bursts
from magnitude_bench.common import save_result


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    """Smoke tests check the shape of results, not their speed: never wait for idle cores."""
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


def _rows(res):
    return {r["policy"]: r for r in res.tables["per policy and attention path"]}


def test_simulated_burst_compares_every_policy(tmp_path):
    res = run_bursts(BackendConfig(kind="simulated:cpu2core-deep"), BurstConfig(n=6, context=1000, own=100, gen=8))
    rows = _rows(res)
    assert set(rows) == {"target:50", "prefill-first", "fixed:2048", "target-v1:50"}
    assert all(r["prompt_rows"] == 6 * 100 for r in rows.values())  # forks evaluate only their own rows
    assert rows["prefill-first"]["ttft_x_pf"] == 1.0
    assert rows["target:50"]["ttft_p50_s"] < rows["prefill-first"]["ttft_p50_s"]
    assert rows["target:50"]["ttft_x_v1"] < 1.0
    assert rows["prefill-first"]["decode_step_ms"] > 0
    assert save_result(res, tmp_path)["md"].exists()


@pytest.mark.slow
def test_tiny_real_burst_is_well_formed():
    cfg = BurstConfig(n=2, context=96, own=16, gen=3, policies=("target:50", "prefill-first"), flash=("off",),
                      cpu_clock=True)
    res = run_bursts(BackendConfig(kind="llama", device="cpu", n_threads=1), cfg)
    rows = _rows(res)
    assert set(rows) == {"target:50", "prefill-first"}
    assert all(r["flash_attn"] == "off" and r["prompt_rows"] == 2 * 16 for r in rows.values())
    assert all(r["ttft_p50_s"] > 0 for r in rows.values())
    assert res.data["backends"]["off"]["attention"].startswith("flash off")
