"""`magnitude-tui generate` into a file or a pipe: the whole table, or JSON (fake backend)."""

from __future__ import annotations

import json

from backend.factory import BackendConfig
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.generate import run_generate


def _client() -> WorkerClient:
    return WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64"),
                        in_process=True)


def test_generate_into_a_file_prints_every_column_whole(capsys):
    code = run_generate(["Say hi."] * 3, _client(), max_tokens=6, temperature=0.0, seed=1, stream=False)
    out = capsys.readouterr().out
    assert code == 0
    header = next(line for line in out.splitlines() if "TTFT ms" in line)
    for column in ("prompt (cached)", "generated", "queue ms", "TTFT ms", "tok/s", "ITL p50", "ITL p95",
                   "tok/step", "accepted", "end"):
        assert column in header
    assert "…" not in out  # nothing squeezed to 80 columns


def test_generate_json_is_one_document_on_stdout(capsys):
    code = run_generate(["Say hi.", "Count to three."], _client(), max_tokens=6, temperature=0.0, seed=1,
                        stream=False, json_out=True)
    captured = capsys.readouterr()
    assert code == 0
    doc = json.loads(captured.out)
    assert [s["prompt"] for s in doc["sequences"]] == ["Say hi.", "Count to three."]
    for s in doc["sequences"]:
        assert s["generated_tokens"] > 0 and s["text"] and s["ttft_ms"] is not None
        assert s["done_reason"] in ("stop", "length") and s["error"] is None
    assert doc["steps"] > 0 and doc["aggregate_tok_s"] > 0
    assert "ready" in captured.err  # the progress went to stderr
