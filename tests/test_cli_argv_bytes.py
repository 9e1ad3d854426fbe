"""A task or prompt typed with bytes that are not UTF-8 (`magnitude-tui run $'\\xff\\xfe task'`):
each such byte reaches the engine as U+FFFD, and stderr says so once. Python hands such bytes over
as lone surrogates, which the tokenizer refused: the first turn failed with "could not prepare the
prompt: ... surrogates not allowed"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import magnitude_tui.generate
from backend.factory import BackendConfig
from magnitude_tui.cli import app
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from tests.needs import need_real_model
from tests.test_cli_probe_newcomer import gguf_trained_on

ROOT = Path(__file__).resolve().parent.parent
# What Python makes of the argv bytes b"\xff\xfe say hi" (PEP 383's surrogateescape).
TYPED = b"\xff\xfe say hi".decode("utf-8", "surrogateescape")
MEANT = "\ufffd\ufffd say hi"


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "not UTF-8" in line]


def test_a_run_task_that_is_not_utf8_reaches_the_engine_replaced_and_warned_once(tmp_path):
    (tmp_path / "none.toml").write_text("")
    r = CliRunner().invoke(app, ["run", TYPED, "--backend", "fake", "--workdir", str(tmp_path),
                                 "--agents", str(tmp_path / "none.toml"), "--json", "--max-tokens", "4"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [m["content"] for m in doc["messages"] if m["role"] == "user"] == [MEANT]
    assert len(_warnings(r.stderr)) == 1 and "2 byte(s)" in _warnings(r.stderr)[0], r.stderr


def test_a_generate_prompt_that_is_not_utf8_reaches_the_engine_replaced_and_warned_once(monkeypatch, tmp_path):
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    fake = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64"),
                        in_process=True)
    monkeypatch.setattr(magnitude_tui.generate, "local_client", lambda *a, **kw: fake)
    r = CliRunner().invoke(app, ["generate", TYPED, "--n", "3", "--model", model, "--device", "cpu",
                                 "--max-tokens", "4", "--json"])
    assert r.exit_code == 0, r.output
    assert [s["prompt"] for s in json.loads(r.stdout)["sequences"]] == [MEANT] * 3
    assert len(_warnings(r.stderr)) == 1, r.stderr


def test_valid_text_is_left_alone_without_a_warning(tmp_path):
    (tmp_path / "none.toml").write_text("")
    r = CliRunner().invoke(app, ["run", "héllo \ufffd", "--backend", "fake", "--workdir", str(tmp_path),
                                 "--agents", str(tmp_path / "none.toml"), "--json", "--max-tokens", "4"])
    assert r.exit_code == 0, r.output
    assert [m["content"] for m in json.loads(r.stdout)["messages"] if m["role"] == "user"] == ["héllo \ufffd"]
    assert not _warnings(r.stderr), r.stderr


@pytest.mark.serial
@pytest.mark.slow
def test_real_model_first_turn_on_a_task_typed_as_bytes_runs(tmp_path):
    need_real_model()
    (tmp_path / "none.toml").write_text("")
    r = subprocess.run([sys.executable, "-m", "magnitude_tui.cli", "run", b"\xff\xfe say hi", "--agents",
                        str(tmp_path / "none.toml"), "--workdir", str(tmp_path), "--json", "--max-turns", "1",
                        "--max-tokens", "4", "--n-ctx", "4096", "--threads", "2"],
                       cwd=ROOT, capture_output=True, timeout=300)
    stderr = r.stderr.decode("utf-8", "replace")
    assert "could not prepare the prompt" not in stderr, stderr
    doc = json.loads(r.stdout)
    assert [m["content"] for m in doc["messages"] if m["role"] == "user"] == [MEANT]
    assert doc["turns"][0]["prompt_tokens"] > 0, doc["turns"]
    assert len(_warnings(stderr)) == 1, stderr
