"""bench soak, short: the scenarios that need no model run from the command's registry and report a
clean row each (the long versions are `magnitude-bench soak`)."""

from __future__ import annotations

import pytest

from magnitude_bench.soak import SCENARIOS, SoakConfig, run_soak

pytestmark = pytest.mark.serial  # asserts on time: runs alone (make test)


def test_the_scenarios_without_a_model_run_clean_and_fill_one_table():
    cfg = SoakConfig(fake_ops=600, bad_rounds=1, flood_rounds=1, kill_rounds=2, db_rounds=5)
    chosen = ("machine-fake", "bad-inputs", "flood", "kill", "databases")
    assert set(chosen) < set(SCENARIOS)
    lines: list[str] = []
    result = run_soak(cfg, chosen, progress=lines.append)
    rows = result.tables["scenarios"]
    assert [r["scenario"] for r in rows] == ["state machine, fake backend", "bad inputs beside good ones",
                                             "flood of 64 requests", "worker kill -9 and restart",
                                             "corrupt, foreign and newer databases"]
    assert result.data["failures"] == {}
    assert all(r["failures"] == 0 for r in rows)
    machine, _, flood, kill, dbs = rows
    assert machine["leaked cells/slots"] == "0/0" and machine["data lost"] == "0 tokens"
    assert machine["steps"] > 0 and machine["requests"] > 0
    assert flood["admitted_by_step_max"] is not None
    assert kill["data lost"] == "0 requests without an error" and kill["error_latency_max_ms"] < 1000
    assert dbs["data lost"] == "0 files"
    # One table: every row carries every column, a scenario's own ones blank elsewhere.
    assert len({tuple(r) for r in rows}) == 1
    assert [line for line in lines if line.startswith("soak: ")] == [f"soak: {name}" for name in chosen]
