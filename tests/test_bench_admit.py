"""bench admit: the simulated profile reproduces the cost-model arithmetic; every run writes well-formed files."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from backend.factory import BackendConfig
from magnitude_bench.admit import AdmitConfig, admit_result, run_admit
from magnitude_bench.cli import bench_app
from magnitude_bench.common import save_result
from magnitude_bench.plots import plot_admit


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    """Smoke tests check the shape of results, not their speed: never wait for idle cores."""
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")

ROW_KEYS = {"policy", "chunk", "running_tok_s", "keep", "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "ttft_s",
            "total_s", "steps", "window_steps", "model_tok_s", "model_ttft_s", "ttft_x_pf", "ttft_x_bound", "meets"}


def test_rx9070xt_profile_reproduces_the_published_arithmetic():
    """8 generating, 8,000 tokens arrive: fixed:32 gives each ~17 tok/s and a ~14.7 s wait;
    prefill-first freezes everyone for ~8.3 s (the RX 9070 XT profile in backend/simulated.py)."""
    cfg = AdmitConfig(fixed=(32,), targets=(50.0,))
    summary, _ = run_admit(BackendConfig(kind="simulated:rx9070xt"), cfg)
    rows = {r["policy"]: r for r in summary["rows"]}
    assert summary["newcomer_tokens"] == 8000
    assert summary["undisturbed_step_ms"] == pytest.approx(25.7, abs=0.01)
    step = 0.0257 + 32 / 962
    assert rows["fixed:32"]["running_tok_s"] == pytest.approx(1 / step, rel=0.01)
    assert rows["fixed:32"]["ttft_s"] == pytest.approx(250 * step, rel=0.01)
    assert rows["prefill-first"]["running_tok_s"] == 0
    assert rows["prefill-first"]["itl_max_ms"] / 1000 == pytest.approx(8000 / 962, rel=0.02)
    for r in rows.values():  # measured = the model's per-step arithmetic
        assert r["running_tok_s"] == pytest.approx(r["model_tok_s"], rel=0.02, abs=0.01)
        assert r["ttft_s"] == pytest.approx(r["model_ttft_s"], rel=0.01)
    assert rows["target:50"]["chunk"] < rows["fixed:32"]["chunk"]  # ~23 rows fit beside 8 decode rows
    # On this additive profile every chunked policy sits on the trade-off bound: the newcomer's TTFT
    # is prefill-first's divided by the share of the machine the running sequences leave it.
    for name in ("fixed:32", "target:50"):
        assert rows[name]["ttft_x_bound"] == pytest.approx(1.0, abs=0.02)


def test_tiny_simulated_run_writes_json_markdown_and_png(tmp_path):
    cfg = AdmitConfig(n_running=2, newcomer_tokens=256, fixed=(16, 64), targets=(40.0,))
    result = admit_result([BackendConfig(kind="simulated:cpu2core")], cfg)
    paths = save_result(result, tmp_path, plot_admit)
    data = json.loads(paths["json"].read_text())
    rows = next(iter(data["tables"].values()))
    assert [r["policy"] for r in rows] == ["prefill-first", "fixed:16", "fixed:64", "target:40"]
    assert all(ROW_KEYS <= set(r) for r in rows)
    assert "| policy |" in paths["md"].read_text()
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_admit_on_a_simulated_profile(tmp_path):
    out = CliRunner().invoke(bench_app, ["admit", "-b", "simulated:rx9070xt", "--n-running", "2", "--newcomer",
                                         "128", "--fixed", "16", "--targets", "40", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".md", ".png"]


@pytest.mark.slow
def test_tiny_real_model_run_is_well_formed(tmp_path):
    cfg = AdmitConfig(n_running=2, warmup_tokens=4, newcomer_tokens=96, fixed=(32,), targets=(60.0,))
    result = admit_result([BackendConfig(kind="llama", device="cpu", n_ctx=2048)], cfg)
    paths = save_result(result, tmp_path, plot_admit)
    rows = next(iter(json.loads(paths["json"].read_text())["tables"].values()))
    assert [r["policy"] for r in rows] == ["prefill-first", "fixed:32", "target:60"]
    for r in rows:
        assert ROW_KEYS <= set(r)
        assert r["ttft_s"] > 0 and r["total_s"] >= r["ttft_s"] and r["steps"] >= r["window_steps"] >= 1
    assert rows[0]["running_tok_s"] == 0  # prefill-first: nobody decodes while the prompt runs
    assert rows[1]["running_tok_s"] > 0
    assert paths["png"].stat().st_size > 0
