"""The benches' harness: one drive loop into a trace, alternating sweeps, and every run's record."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from backend.factory import BackendConfig, build_backend
from magnitude_bench import common
from magnitude_bench.cli import bench_app
from magnitude_bench.common import BenchResult, machine_info, prompt_tokens
from magnitude_bench.harness import Drive, alternating, recorded, sweep
from scheduler.types import Request, SamplingParams


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")


@pytest.fixture
def backend():
    b = build_backend(BackendConfig(kind="simulated:cpu2core", n_ctx=8192, n_seq_max=4))
    yield b
    b.close()


def _req(backend, rid: str, n: int, gen: int, **kw) -> Request:
    return Request(rid, rid, (), SamplingParams(temperature=0.0, max_tokens=gen),
                   prompt_tokens=prompt_tokens(backend, n, salt=len(rid)), **kw)


def test_a_drive_asks_every_request_for_its_max_tokens_unless_told_not_to(backend):
    for fixed, expected in ((True, True), (False, False)):
        drive = Drive(backend, policy="fixed:64", gen_reserve=8, fixed_length=fixed)
        seen = []
        submit = drive.engine.submit
        drive.engine.submit = lambda r: (seen.append(r), submit(r))[1]
        drive.run([_req(backend, "a", 20, 2)])
        drive.close()
        assert [r.sampling.ignore_eos for r in seen] == [expected]
        assert seen[0].sampling.max_tokens == 2 and seen[0].request_id == "a"


def test_a_drive_books_every_token_and_step_and_leaves_the_engine_empty(backend):
    drive = Drive(backend, policy="fixed:64", gen_reserve=8)
    tr = drive.run([_req(backend, "a", 100, 5), _req(backend, "bb", 40, 3)])
    assert len(tr.tokens["a"]) == 5 and len(tr.tokens["bb"]) == 3  # fixed length: exactly max_tokens
    assert sum(s.prefill_rows for s in tr.steps) == 140 and tr.made() == 8
    assert sum(s.tokens for s in tr.steps) == 8
    # Token times are the engine clock at the end of the step that made them, in step order.
    assert tr.tokens["a"] == sorted(tr.tokens["a"]) and set(tr.tokens["a"]) <= {s.t for s in tr.steps}
    # The first token comes after the prompt: 100 rows at 64 a step take two steps.
    assert tr.ttft("a") > 0 and tr.ttft_ms["a"] == pytest.approx(tr.ttft("a") * 1000, rel=0.01)
    assert len(tr.itl_ms("a")) == 4 and all(g > 0 for g in tr.itl_ms("a"))
    assert set(tr.done) == {"a", "bb"} and tr.ended >= max(tr.done.values())
    assert all(s.native_ms is not None for s in tr.busy_steps)  # the StepTimer timed every decode
    drive.close()
    assert drive.engine.is_empty() and backend.kv_cells_used() == 0


def test_close_cancels_what_still_runs_and_a_failed_request_stops_the_measurement(backend):
    drive = Drive(backend, policy="fixed:64", what="probe")
    drive.submit(_req(backend, "endless", 16, 100_000))
    drive.until(lambda: len(drive.trace.tokens["endless"]) >= 3)
    drive.close()  # cancels it: nothing leaks
    assert drive.engine.is_empty()
    drive = Drive(backend, policy="fixed:64", what="probe")
    drive.submit(_req(backend, "toolong", backend.n_ctx + 10, 1))
    with pytest.raises(RuntimeError, match="probe: request toolong failed"):
        drive.run_out()


def test_an_engine_that_goes_idle_before_the_scenario_ends_is_an_error(backend):
    drive = Drive(backend, policy="fixed:64", what="idle")
    with pytest.raises(RuntimeError, match="idle: the engine went idle"):
        drive.until(lambda: False)


def test_repetitions_alternate_abab_with_every_other_one_reversed():
    assert alternating(("a", "b"), 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    seen = []
    records = sweep(("x", "y"), 2, lambda c, rep: seen.append((c, rep)) or {"value": len(seen)}, quiet=False)
    assert seen == [("x", 0), ("y", 0), ("y", 1), ("x", 1)]
    # Every repetition is kept, each with the load others put on the machine while it ran.
    assert [(r["config"], r["rep"], r["value"]) for r in records] == [("x", 0, 1), ("y", 0, 2), ("y", 1, 3), ("x", 1, 4)]
    assert all(r["others_cores"] >= 0 for r in records)


def test_a_recorded_run_takes_the_load_before_it_runs_and_after(monkeypatch):
    loads = iter([(1.0, 1.0, 1.0), (3.0, 2.0, 1.0)])
    monkeypatch.setattr(common.os, "getloadavg", lambda: next(loads))
    ran = []

    @recorded
    def bench() -> BenchResult:
        ran.append(True)  # the load before was read already
        return BenchResult("x", "x", {}, machine_info())

    res = bench(argv=["magnitude-bench", "x", "--reps", "2"])
    assert ran and res.run["load_avg_before"] == [1.0, 1.0, 1.0] and res.run["load_avg_after"] == [3.0, 2.0, 1.0]
    assert res.machine["load_avg_1_5_15"] == [1.0, 1.0, 1.0] and res.machine["load_avg_at_end"] == [3.0, 2.0, 1.0]
    assert res.run["command"] == "magnitude-bench x --reps 2" and res.run["git"] != "?"
    assert res.run["started"].endswith("Z") and res.run["wall_s"] >= 0


def test_a_bench_command_writes_its_run_and_every_repetition(tmp_path):
    out = CliRunner().invoke(bench_app, ["fork", "--backend", "simulated:cpu2core", "--n", "2", "--parent", "200",
                                         "--task", "8", "--gen", "2", "--reps", "2", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    [path] = tmp_path.glob("fork-*.json")
    saved = json.loads(path.read_text())
    assert {"command", "git", "started", "wall_s", "load_avg_before", "load_avg_after"} <= set(saved["run"])
    assert [(r["config"], r["rep"]) for r in saved["repetitions"]] == [("forked", 0), ("cold", 0), ("cold", 1),
                                                                       ("forked", 1)]
    assert all(len(r["ttft"]) == 2 for r in saved["repetitions"])
