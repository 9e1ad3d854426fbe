"""bench kv-span: the same decode rows over a unified cache's span, one shared prompt, a stream each."""

from __future__ import annotations

import pytest

from magnitude_bench import peers
from magnitude_bench.common import save_result
from magnitude_bench.kv_span import LAYOUTS, KvSpanConfig, run_kv_span
from tests.needs import llama_tools

pytestmark = pytest.mark.slow


def test_three_layouts_run_the_same_rows_in_alternating_order_and_report_each_span(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")  # a smoke run: no waiting for a quiet machine
    cfg = KvSpanConfig(prompt=48, seqs=2, gen=4, reps=2)
    if llama_tools() is None:  # outside make test, without the build: a clear error, nothing run
        with pytest.raises(peers.PeerError, match="build_llama_tools"):
            run_kv_span(cfg)
        return
    res = run_kv_span(cfg)
    names = [name for name, _, _ in LAYOUTS]
    assert [r["layout"] for r in res.repetitions] == names + names[::-1]  # every other repetition reversed
    [table] = res.tables.values()
    rows = {r["layout"]: r for r in table}
    whole = cfg.seqs * (cfg.prompt + cfg.gen)
    assert rows["unified, a prompt per sequence"]["cells_per_row"] == whole  # every sequence's cells
    assert rows["unified, one prompt shared"]["cells_in_use"] == cfg.prompt + cfg.seqs * cfg.gen
    assert rows["a stream per sequence"]["cells_in_use"] == whole
    assert rows["a stream per sequence"]["cells_per_row"] == cfg.prompt + cfg.gen  # its own only
    assert rows["unified, a prompt per sequence"]["tg ÷ unified"] == 1.0
    assert all(r["tg_tok_s"] > 0 and r["pp_tok_s"] > 0 and r["reps"] == 2 for r in table)
    assert save_result(res, tmp_path, None)["md"].exists()
