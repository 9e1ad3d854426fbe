"""bench fork: forked subagents reuse the parent's context and reach their first token sooner."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.fork import ForkConfig, run_fork
from magnitude_bench.plots import plot_fork


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    """Smoke tests check the shape of results, not their speed: never wait for idle cores."""
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


def _rows(res):
    return {r["mode"]: r for r in next(iter(res.tables.values()))}


def test_simulated_fork_reuses_the_parent_prefix(tmp_path):
    res = run_fork(BackendConfig(kind="simulated:cpu2core"), ForkConfig(n=3, parent_tokens=400, task_tokens=16, gen=2))
    rows = _rows(res)
    assert rows["forked"]["cached_min"] == 400 and rows["cold"]["cached_min"] == 0
    assert rows["forked"]["prompt_rows"] == 3 * 16
    assert rows["cold"]["prompt_rows"] == 3 * 416
    assert rows["forked"]["ttft_max_s"] < rows["cold"]["ttft_p50_s"]
    assert save_result(res, tmp_path, plot_fork)["png"].exists()


@pytest.mark.slow
def test_tiny_real_fork_is_well_formed():
    res = run_fork(BackendConfig(kind="llama", device="cpu"), ForkConfig(n=2, parent_tokens=160, task_tokens=8, gen=2))
    rows = _rows(res)
    assert rows["forked"]["cached_min"] == 160
    assert rows["forked"]["prompt_rows"] == 2 * 8
    assert all(t > 0 for ts in res.data["ttft_s"].values() for t in ts)
