"""`magnitude-tui generate` into a file or a pipe: the whole table, or JSON (fake backend)."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_an_unreadable_prompts_file_is_one_line_and_exit_2(tmp_path, kind):
    from typer.testing import CliRunner

    from magnitude_tui.cli import app

    path = tmp_path / "prompts.txt"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00\x81 not text")
    r = CliRunner().invoke(app, ["generate", "--prompts", str(path)])  # before any model loads
    assert r.exit_code == 2, r.output
    assert "cannot read --prompts" in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
