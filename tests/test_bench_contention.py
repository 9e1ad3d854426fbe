"""bench contention's pieces that need no model: the busy processes and the summary table."""

from __future__ import annotations

import os

from magnitude_bench.contention import StepSeen, busy_processes, step_stats, summarize


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_busy_processes_run_while_held_and_are_gone_after() -> None:
    with busy_processes(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids) and os.getpid() not in pids
    assert not any(_alive(p) for p in pids)


def test_the_summary_compares_the_engine_with_its_quiet_self_and_the_best_peer_under_each_load() -> None:
    def run(load, variant, tok_s, **extra):
        return {"load": load, "variant": variant, "tok_s": tok_s, "loadavg_1m": 1.0, "others_cores": 0.1,
                "threads_mean": 1.0 if variant == "engine" else None, **extra}

    runs = [run(0, "engine", 30.0), run(0, "llama-batched-bench -t 1", 28.0), run(0, "llama-batched-bench -t 2", 60.0),
            run(1, "engine", 24.0), run(1, "engine", 26.0), run(1, "llama-batched-bench -t 1", 27.0),
            run(1, "llama-batched-bench -t 2", 2.0, timed_out=True)]
    quiet, busy = summarize(runs, (0, 1), ["engine"], cores=2)
    assert quiet["engine vs quiet"] == 1.0 and quiet["best peer"] == "-t 2" and quiet["engine vs best peer"] == 0.5
    assert busy["engine tok/s"] == 25.0 and busy["engine vs quiet"] == 0.83
    assert busy["best peer"] == "-t 1" and busy["engine vs best peer"] == 0.93
    assert busy["-t 2 tok/s"] == "<2.0"  # stopped at the limit: at most that


def test_step_stats_say_where_a_rounds_time_went() -> None:
    steps = [StepSeen(512, 400.0, 1)] + [StepSeen(0, 100.0, 1)] * 30 + [StepSeen(0, 1500.0, 2)]
    stats = step_stats(steps, wall_s=5.0)
    assert stats["steps"] == 32 and stats["prompt_steps"] == 1
    assert abs(stats["in_steps"] - (0.4 + 3.0 + 1.5) / 5.0) < 1e-9
    assert abs(stats["probing"] - 1.5 / 5.0) < 1e-9  # the step on 2 threads, where most ran on 1
    assert step_stats([StepSeen(0, 100.0, None)], wall_s=1.0)["probing"] == 0.0
