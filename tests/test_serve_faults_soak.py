"""`bench soak --only serve-faults`, one round: flood, hostile headers, kill -9, SIGTERM."""

from __future__ import annotations

from magnitude_bench.soak import SCENARIOS, SoakConfig, run_soak


def test_the_serve_faults_scenario_ends_every_stream_explicitly():
    assert "serve-faults" in SCENARIOS
    result = run_soak(SoakConfig(serve_rounds=1), ("serve-faults",))
    [row] = result.tables["scenarios"]
    assert result.data["failures"] == {}, result.data["failures"]
    assert row["data lost"] == "0 of 5 streams not ended explicitly"
    assert row["flood_log_bytes_max"] < 20_000
