"""The bare `magnitude-tui` command: its options reach the app (run_app is replaced, no TUI runs)."""

from __future__ import annotations

from typer.testing import CliRunner

import magnitude_tui.app
import magnitude_tui.preflight
from magnitude_tui.cli import app
from scheduler.types import SamplingParams
from tests.gguf_files import tiny_gguf


def _launch(monkeypatch, *args: str, tmp_path):
    seen = {}
    monkeypatch.setattr(magnitude_tui.app, "run_app",
                        lambda config, **kwargs: seen.update(config=config, **kwargs))
    model = str(tiny_gguf(tmp_path / "tiny.gguf"))
    result = CliRunner().invoke(app, ["--model", model, *args])
    return result, seen


def test_replies_are_sampled_by_default_and_the_options_reach_the_app(monkeypatch, tmp_path):
    result, seen = _launch(monkeypatch, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert seen["sampling"] == SamplingParams(temperature=0.7, max_tokens=512, seed=None)
    assert seen["config"].backend.n_threads >= 1 and seen["resume"] is False
    monkeypatch.setattr(magnitude_tui.preflight, "usable_cpus", lambda: 4)  # --threads 3 fits on any machine
    result, seen = _launch(monkeypatch, "--temperature", "0", "--max-tokens", "99", "--seed", "7",
                           "--policy", "fixed:64", "--threads", "3", "--resume", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert seen["sampling"] == SamplingParams(temperature=0.0, max_tokens=99, seed=7)
    assert (seen["config"].policy, seen["config"].backend.n_threads, seen["resume"]) == ("fixed:64", 3, True)


def test_bad_sampling_options_are_refused_before_anything_starts(monkeypatch, tmp_path):
    for args in (["--temperature", "-1"], ["--max-tokens", "0"]):
        result, seen = _launch(monkeypatch, *args, tmp_path=tmp_path)
        assert result.exit_code == 2 and not seen
        assert args[0] in result.output


def test_remote_servers_replace_the_local_engine(monkeypatch, tmp_path):
    from magnitude_tui.engine.protocol import EngineClient
    from magnitude_tui.remote.client import RemoteClient

    monkeypatch.setenv("MY_KEY", "k")
    result, seen = _launch(monkeypatch, "--remote", "http://a:1", "--remote", "http://b:2/v1",
                           "--remote-model", "m", "--api-key-env", "MY_KEY", tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    client = seen["config"]
    assert isinstance(client, RemoteClient) and isinstance(client, EngineClient)
    assert client.config.urls == ("http://a:1", "http://b:2/v1")
    assert (client.config.model, client.config.api_key) == ("m", "k")
    for args, why in ((["--remote", "a:1"], "not a server URL"),
                      (["--remote", "http://a:1", "--api-key-env", "UNSET_VAR"], "UNSET_VAR")):
        result, seen = _launch(monkeypatch, *args, tmp_path=tmp_path)
        assert result.exit_code == 2 and not seen and why in result.output


def test_export_dir_reaches_the_app(monkeypatch, tmp_path):
    result, seen = _launch(monkeypatch, "--export-dir", str(tmp_path / "out"), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert seen["export_dir"] == tmp_path / "out"
    result, seen = _launch(monkeypatch, tmp_path=tmp_path)
    assert seen["export_dir"] is None  # the app's default: exports in the data directory
