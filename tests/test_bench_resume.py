"""bench resume: the first reply after a resume, cold vs warm (KV restored from disk)."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.resume import ResumeConfig, run_resume


def _rows(res):
    return {r["mode"]: r for r in next(iter(res.tables.values()))}


def test_simulated_resume_prefills_only_the_new_turn_when_warm(tmp_path):
    res = run_resume(BackendConfig(kind="simulated:cpu2core"), ResumeConfig(history_tokens=600, gen=2, reps=2))
    rows = _rows(res)
    [state] = res.tables["the saved state"]
    assert state["history_tokens"] >= 600 and state["bytes_per_token"] > 0
    assert rows["cold"]["cached_tokens"] == 0 and rows["cold"]["runs"] == rows["warm"]["runs"] == 2
    new_turn = rows["warm"]["prompt_tokens"] - rows["warm"]["cached_tokens"]
    assert rows["warm"]["cached_tokens"] > state["history_tokens"] and new_turn < 60
    # On the simulated CPU's clock prefill costs ~4.8 ms a row: the TTFT follows the rows prefilled.
    assert rows["warm"]["ttft_p50_ms"] < 0.2 * rows["cold"]["ttft_p50_ms"]
    assert save_result(res, tmp_path)["json"].exists()


@pytest.mark.serial
@pytest.mark.slow
def test_real_model_resume_is_warm(tmp_path):
    res = run_resume(BackendConfig(kind="llama", device="cpu", n_threads=1),
                     ResumeConfig(history_tokens=300, gen=2, reps=1))
    rows = _rows(res)
    assert rows["warm"]["cached_tokens"] >= 300 > rows["cold"]["cached_tokens"] == 0
    assert rows["warm"]["ttft_p50_ms"] < rows["cold"]["ttft_p50_ms"]
