"""`bench structured` on the fake backend: both modes run alternately, ratios and the grammar's share are reported, the JSON is written."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from backend.factory import BackendConfig
from magnitude_bench.cli import bench_app
from magnitude_bench.common import save_result
from magnitude_bench.structured import CONSTRAINED, FREE, StructuredConfig, run_structured

REPLY = '{"name": "Ann", "age": 30, "city": "Oslo"}'  # what the scripted backend writes, in either mode


def test_both_modes_alternate_and_constrained_replies_validate(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")
    cfg = StructuredConfig(seqs=(1, 3), max_tokens=64, reps=2, peer=False, in_process=True, timeout_s=60)
    result = run_structured(BackendConfig("fake", reply=REPLY, n_ctx=4096), cfg, argv=["bench", "structured"])
    runs = result.data["runs"]
    assert [(r["seqs"], r["rep"], r["mode"]) for r in runs] == [
        (1, 1, FREE), (1, 1, CONSTRAINED), (1, 2, CONSTRAINED), (1, 2, FREE),
        (3, 1, FREE), (3, 1, CONSTRAINED), (3, 2, CONSTRAINED), (3, 2, FREE)]
    assert all(r["made"] == r["replies"] * len(REPLY) and r["valid"] == r["replies"] for r in runs)
    # Free replies were bounded at the JSON replies' length, so both modes made the same tokens.
    assert result.data["free_tokens"] == len(REPLY) and result.data["free_tokens_matched"]
    assert all(r["grammar_ms"] > 0 for r in runs if r["mode"] == CONSTRAINED)
    assert all(r["grammar_ms"] == 0 for r in runs if r["mode"] == FREE)
    (table,) = result.tables.values()
    assert [row["seqs"] for row in table] == [1, 3]
    assert all(row["json_schema ÷ free"] > 0 and row["valid json"] == f"{2 * row['seqs']}/{2 * row['seqs']}"
               for row in table)
    assert result.run["command"] == "bench structured" and result.run["git"]
    assert result.run["load_avg_before"] == result.machine["load_avg_1_5_15"] and result.run["load_avg_after"]
    paths = save_result(result, tmp_path)
    saved = json.loads(paths["json"].read_text())
    assert len(saved["data"]["runs"]) == 8 and "load_avg_at_end" in saved["machine"]
    assert saved["run"]["command"] == "bench structured"


def test_the_command_prints_its_table_and_writes_json(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")
    out = CliRunner().invoke(bench_app, ["structured", "--backend", "fake", "--seqs", "2", "--reps", "1",
                                         "--max-tokens", "8", "--free-tokens", "5", "--no-peer", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "json_schema ÷ free" in out.output
    (path,) = tmp_path.glob("structured-*.json")
    saved = json.loads(path.read_text())
    assert {r["mode"] for r in saved["data"]["runs"]} == {FREE, CONSTRAINED}
    assert saved["config"]["structured"]["seqs"] == [2] and saved["data"]["free_tokens"] == 5
    assert {r["made"] for r in saved["data"]["runs"] if r["mode"] == FREE} == {2 * 5}


def test_a_given_free_bound_caps_the_free_replies_only(monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")
    cfg = StructuredConfig(seqs=(2,), max_tokens=64, free_tokens=10, reps=1, peer=False, in_process=True,
                           timeout_s=60)
    result = run_structured(BackendConfig("fake", reply=REPLY, n_ctx=4096), cfg, argv=["bench", "structured"])
    made = {r["mode"]: r["made"] for r in result.data["runs"]}
    assert made == {FREE: 2 * 10, CONSTRAINED: 2 * len(REPLY)}
    assert result.data["free_tokens"] == 10 and not result.data["free_tokens_matched"]
