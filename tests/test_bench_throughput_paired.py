"""bench throughput --paired: both sides at once, only runs made while the other side ran, ratios
as the median of the repetitions' pairs."""

from __future__ import annotations

import threading

import pytest
from typer.testing import CliRunner

from backend.factory import BackendConfig
from magnitude_bench.cli import bench_app as app
from magnitude_bench.common import BenchResult
from magnitude_bench.throughput import ThroughputConfig, _paired_tables, run_throughput
from magnitude_bench.throughput_paired import pair_ratios, race


def test_a_side_keeps_running_until_the_other_has_its_runs_and_counts_only_its_first():
    done = [0, 0]
    fast_calls: list[int] = []
    fifth = threading.Event()

    def fast(k: int) -> dict:
        fast_calls.append(k)
        if k == 4:
            fifth.set()
        return {"k": k}

    def slow(k: int) -> dict:
        if k == 2:
            assert fifth.wait(10)  # the slow side's last counted run ends after the fast side's fifth
        return {"k": k}

    got: dict[str, list] = {}
    t = threading.Thread(target=lambda: got.update(slow=race(slow, 3, done, 1, 0)))
    t.start()
    got["fast"] = race(fast, 3, done, 0, 1)
    t.join(10)
    assert [r["k"] for r in got["fast"]] == [0, 1, 2]  # the first three count
    assert len(fast_calls) >= 5  # it ran on while the slow side had not finished its three
    assert [r["k"] for r in got["slow"]] == [0, 1, 2]
    assert done == [1, 1]


def test_pair_ratios_divide_the_engines_median_by_the_peers_per_width_and_policy():
    engine = [{"seqs": 1, "peer": "engine a", "tok_s": x} for x in (10.0, 12.0, 11.0)] + \
             [{"seqs": 1, "peer": "engine b", "tok_s": x} for x in (9.0, 9.0, 30.0)]
    peer = [{"seqs": 1, "peer": "llama-server -np N", "tok_s": x} for x in (10.0, 11.0, 100.0)]
    got = {r["policy"]: r for r in pair_ratios(engine, peer, ("a", "b"))}
    assert got["a"]["ratio"] == 1.0 and got["a"]["engine_tok_s"] == 11.0 and got["a"]["peer_tok_s"] == 11.0
    assert got["b"]["ratio"] == round(9.0 / 11.0, 4)


def test_the_paired_table_is_the_median_of_the_repetitions_ratios():
    cfg = ThroughputConfig(seqs=(8,), reps=3, policies=("a",), paired=True)
    pairs = [{"rep": i, "peer": "llama-server -np N", "seqs": 8, "policy": "a", "ratio": r}
             for i, r in enumerate((0.9, 1.05, 1.02))]
    res = BenchResult(name="throughput", title="t", config={})
    _paired_tables(res, pairs, cfg)
    row = next(v for k, v in res.tables.items() if k.startswith("both sides at once"))[0]
    assert row["a ÷ server"] == 1.02 and row["a ÷ server (min-max)"] == "0.900-1.050"


@pytest.mark.parametrize("args, says", [
    (["--threads", "2"], "--threads 1"),
    (["--threads", "1", "--peers", "serial"], "batched-bench,server"),
])
def test_a_paired_run_that_cannot_be_made_is_refused_with_what_to_change(args, says):
    out = CliRunner().invoke(app, ["throughput", "--paired", *args])
    assert out.exit_code != 0
    assert says in out.output


@pytest.mark.slow
@pytest.mark.serial  # a core per side
def test_a_tiny_paired_run_counts_the_same_runs_on_both_cores():
    from tests.needs import llama_tools, need_real_model

    need_real_model()
    if llama_tools() is None:
        pytest.fail("--paired needs llama.cpp's tools: scripts/build_llama_tools.sh")
    cfg = ThroughputConfig(seqs=(1,), prompt=16, gen=4, reps=2, policies=("target:50",), peers=("server",),
                           require_tools=True, paired=True, pair_runs=2)
    res = run_throughput(BackendConfig(kind="llama", device="cpu", n_ctx=1024, n_threads=1), cfg)
    runs = res.data["runs"]
    for rep in (0, 1):
        mine = [r for r in runs if r["rep"] == rep and r["peer"] == "engine target:50"]
        theirs = [r for r in runs if r["rep"] == rep and r["peer"] == "llama-server -np N"]
        assert len(mine) == len(theirs) == 2  # the counted runs: the first two of each side
        assert {r["core"] for r in mine}.isdisjoint({r["core"] for r in theirs})  # a core each
    assert {r["core"] for r in runs if r["rep"] == 0} == {r["core"] for r in runs if r["rep"] == 1}
    assert all(r["made"] == 4 for r in runs)  # the same work on both sides
    assert [p["engine_core"] for p in res.data["pairs"]][0] != [p["engine_core"] for p in res.data["pairs"]][1]
    assert all(p["ratio"] > 0 for p in res.data["pairs"])


def test_a_side_ended_from_outside_takes_the_processes_it_started_with_it():
    import asyncio
    import subprocess

    from magnitude_tui.agent.process_group import end_group, group_running

    # A side and the server it started share a group of their own (side_main's setpgrp).
    side = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        assert group_running(side.pid)
        asyncio.run(end_group(side.pid, 5))
        side.wait(5)
        assert not group_running(side.pid)  # the shell's background sleep went with it
    finally:
        if side.poll() is None:
            side.kill()
