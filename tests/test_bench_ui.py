"""bench ui: the keypress and step-time measurements come out well formed (shape only, not speed)."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.ui import UiConfig, run_ui_bench
from magnitude_tui.engine.events import EngineConfig
from tests.needs import need_real_model


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


def _check(res, panes: int, keys: int) -> None:
    steps, lat = res.tables.values()
    assert [r["mode"] for r in steps] == ["headless", "ui"]
    assert [r["mode"] for r in res.data["runs"]] == ["headless", "ui"]
    ui_run = res.data["runs"][1]
    assert 1 <= len(ui_run["keys"]) <= keys and ui_run["frames"] > 0
    assert lat[0]["painted"] == lat[0]["keys"] >= 1  # every key reached the screen
    assert 0 < lat[0]["p50_ms"] <= lat[0]["max_ms"] < 5000
    assert all(r["wall_s"] > 0 for r in steps)
    assert res.machine["load_avg_1_5_15"]


@pytest.mark.timeout(120)
def test_fake_backend_bench_ui_is_well_formed(tmp_path):
    cfg = UiConfig(panes=2, max_tokens=6, keys=3, key_interval_s=0.02, reps=1)
    res = run_ui_bench(EngineConfig(BackendConfig("fake", n_ctx=2048)), cfg)
    _check(res, 2, 3)
    assert save_result(res, tmp_path)["json"].exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_real_bench_ui_is_well_formed():
    need_real_model()
    cfg = UiConfig(panes=2, max_tokens=12, keys=3, key_interval_s=0.05, reps=1)
    res = run_ui_bench(EngineConfig(BackendConfig("llama", device="cpu", n_ctx=2048)), cfg)
    _check(res, 2, 3)
    headless = next(iter(res.tables.values()))[0]
    assert headless["steps(2x0)"] > 0 and headless["step_ms_p50"] > 0


def test_keys_never_painted_count_in_the_percentiles_as_their_timeout():
    # Left out, a run whose slowest 10 % of keys never showed read p95 = the fast keys' 10 ms.
    from magnitude_bench.ui_keys import KeyFigures

    figures = KeyFigures.of([10.0] * 18 + [None, None], timeout_ms=2000.0)
    assert figures.missed == 2
    assert figures.p50_ms == 10.0 and figures.p95_ms == 2000.0 and figures.max_ms == 2000.0
    assert KeyFigures.of([]) == KeyFigures(None, None, None, 0)


def test_each_resize_is_timed_to_its_first_laid_out_frame_and_its_key_is_told_apart():
    from magnitude_bench.ui_endurance import EnduranceResult, _frame_after

    frames = [1.000, 1.120, 2.050]
    assert _frame_after(frames, 1.05) == pytest.approx(70.0)  # the frame at 1.12, not the one before
    assert _frame_after(frames, 2.05) is None  # a frame at the very moment was drawn before it
    assert _frame_after(frames, 3.0) is None
    r = EnduranceResult(config={"panes": 8}, wall_s=1, tokens=0, resizes=2, rss_start_mb=0, rss_mid_mb=0,
                        rss_end_mb=0, reply_chars=0, keys=[300.0, 5.0, 6.0, 250.0, None],
                        after_resize=[True, False, False, True, False])
    assert r.keys_where(True).p50_ms == 275.0
    assert r.keys_where(False).max_ms == 2000.0 and r.keys_where(False).missed == 1


@pytest.mark.timeout(120)
async def test_the_floor_run_resizes_empty_panes_and_times_each_resize_and_its_key():
    from magnitude_bench.ui_endurance import EnduranceConfig, run_endurance

    r = await run_endurance(EnduranceConfig(panes=3, stream=False, resizes=3, history=2))
    assert r.resizes == 3 and r.tokens == 0 and len(r.keys) == 3 and r.after_resize == [True] * 3
    assert r.widgets > 3 * 4  # each pane's four messages of history are on screen
    assert all(k is not None and 0 < k < 2000 for k in r.keys)
    assert len(r.resize_frames_ms) == 3 and all(ms is not None and ms > 0 for ms in r.resize_frames_ms)
    assert "3 empty panes, 2 turns of history each" in r.summary()
