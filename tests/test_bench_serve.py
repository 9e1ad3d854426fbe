"""`bench serve`: alternating repetitions, the ratio per width, and only the parts asked for."""

from __future__ import annotations

import pytest

from magnitude_bench.common import BenchResult
from magnitude_bench.serve_load import ServeBenchConfig, burst_prompt, run_serve_bench, serve_ratios


def _r(peer, clients, rep, tok_s):
    return {"peer": peer, "clients": clients, "rep": rep, "agg_tok_s": tok_s}


def test_the_ratio_is_the_median_of_the_repetitions_side_by_side():
    result = BenchResult("serve", "t", {}, {})
    serve_ratios(result, [_r("serve (this engine)", 8, 1, 100.0), _r("llama-server -np 8", 8, 1, 100.0),
                     _r("llama-server -np 8", 8, 2, 100.0), _r("serve (this engine)", 8, 2, 90.0),
                     _r("serve (this engine)", 8, 3, 120.0), _r("llama-server -np 8", 8, 3, 100.0),
                     _r("serve (this engine)", 1, 1, 50.0)])  # no peer at 1 client: no ratio
    assert result.notes == ["8 clients: serve / llama-server aggregate tok/s = 1.00x "
                            "(median of 3 alternating repetitions: 1.00, 0.90, 1.20)"]


@pytest.mark.serial
@pytest.mark.slow
def test_bench_serve_runs_only_the_parts_asked_for_with_distinct_prompts_per_repetition():
    cfg = ServeBenchConfig(seqs=(1, 2), gen=4, threads=2, n_ctx=2048, peers=("serve",), reps=2,
                           parts=("clients",))
    result = run_serve_bench(cfg, model=None, progress=lambda _: None)
    assert list(result.tables) == ["concurrent clients"]
    rows = result.tables["concurrent clients"]
    assert [(r["clients"], r["rep"]) for r in rows] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert all(r["errors"] == 0 and r["tokens"] == 4 * r["clients"] and r["agg_tok_s"] > 0 for r in rows)


def test_the_priority_part_fails_with_the_reason_when_the_engine_does_not_start(tmp_path):
    # It waited for EngineReady in a loop that skipped EngineFailed: a model that did not load
    # left `bench serve` polling forever.
    import threading

    from magnitude_bench.serve_priority import run_priority
    from magnitude_tui.engine.waiting import EngineStartFailed

    cfg = ServeBenchConfig(seqs=(1,), gen=4, threads=1, n_ctx=2048, peers=("serve",), parts=("priority",))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            run_priority(cfg, model=str(tmp_path / "missing.gguf"), progress=lambda _: None)
        except BaseException as e:  # noqa: BLE001 - the test reports whatever came out
            raised.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "still waiting for an engine that failed to start"
    assert len(raised) == 1 and isinstance(raised[0], EngineStartFailed), raised
    assert "missing.gguf" in str(raised[0])


def test_no_two_calls_of_a_run_send_the_same_prompt():
    # Repetition 1 at width 2 once sent the prompts of width 12 in repetition 0: the server's prefix
    # cache then answered from KV the run was meant to compute.
    widths, reps = (1, 2, 4, 8, 12, 16), 3
    prompts = [burst_prompt(rep, n, i)[0]["content"] for rep in range(reps) for n in widths for i in range(n)]
    assert len(set(prompts)) == len(prompts)
