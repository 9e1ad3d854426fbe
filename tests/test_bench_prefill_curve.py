"""bench prefill-curve: the fit recovers a simulated profile; a tiny real run is well formed."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.plots import plot_prefill_curve
from magnitude_bench.prefill_curve import CurveConfig, curve_result


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    """Smoke tests check the shape of results, not their speed: never wait for idle cores."""
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


def test_fit_recovers_the_simulated_cost_model(tmp_path):
    cfg = CurveConfig(chunks=(1, 16, 256), n_decode=4, seqs=(1, 2, 4), reps=1)
    res = curve_result(BackendConfig(kind="simulated:cpu2core"), cfg)
    fit = res.data["fit"]
    assert fit["fixed_ms"] == pytest.approx(4.3, abs=0.01)
    assert fit["decode_ms"] == pytest.approx(6.7, abs=0.01)
    assert fit["prefill_tok_s"] == pytest.approx(210, rel=0.001)
    assert res.data["engine_calibration"]["prefill_ms"] == pytest.approx(1000 / 210, rel=1e-3)
    with_decode = [r for r in res.data["prefill"] if r["mode"] == "with_decode"]
    assert all(r["prefill_tok_s"] == pytest.approx(210, rel=0.01) for r in with_decode)
    paths = save_result(res, tmp_path, plot_prefill_curve)
    assert paths["png"].exists() and "cost model" in paths["md"].read_text()


@pytest.mark.slow
def test_tiny_real_curve_is_well_formed(tmp_path):
    cfg = CurveConfig(chunks=(1, 8, 32), n_decode=2, seqs=(1, 2), reps=1)
    res = curve_result(BackendConfig(kind="llama", device="cpu", n_ctx=1024), cfg)
    assert [r["seqs"] for r in res.data["decode"]] == [1, 2]
    assert all(r["step_ms"] > 0 for r in res.data["decode"])
    assert [r["chunk"] for r in res.data["prefill"]] == [1, 1, 8, 8, 32, 32]
    alone = [r for r in res.data["prefill"] if r["mode"] == "alone"]
    assert all(r["prefill_tok_s"] > 0 for r in alone)
    assert res.data["fit"]["prefill_ms"] > 0
    assert "fixed_ms" in res.data["engine_calibration"]
    assert save_result(res, tmp_path, plot_prefill_curve)["png"].exists()
