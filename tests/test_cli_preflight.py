"""Bad options and bad model files are refused before the app opens: one line on stderr, no
traceback, a non-zero exit, and run_app never called (so no screen is drawn)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import magnitude_tui.app
from magnitude_tui.cli import app
from tests.gguf_files import tiny_gguf
from tests.needs import need_real_model


@pytest.fixture
def model(tmp_path):
    return str(tiny_gguf(tmp_path / "tiny.gguf"))


def _bad_files(tmp_path) -> dict[str, tuple[str, str]]:
    """name -> (path, what the message must say)"""
    good = tiny_gguf(tmp_path / "good.gguf").read_bytes()
    files = {"zero-byte": b"", "truncated": good[:-4], "header only": good[:40],
             "random bytes": os.urandom(4096)}
    out = {}
    for name, data in files.items():
        path = tmp_path / f"{name.replace(' ', '-')}.gguf"
        path.write_bytes(data)
        out[name] = str(path)
    return {
        "zero-byte": (out["zero-byte"], "is empty"),
        "truncated": (out["truncated"], "is truncated"),
        "header only": (out["header only"], "is truncated"),
        "random bytes": (out["random bytes"], "is not a GGUF model file"),
        "directory": (str(tmp_path), "is a directory"),
        "missing": (str(tmp_path / "nope.gguf"), "not found"),
    }


def _launch(monkeypatch, *args: str):
    started = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: started.append(config))
    return CliRunner().invoke(app, list(args)), started


def _assert_refused(result, started, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    assert not started, "the app was started"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", ["zero-byte", "truncated", "header only", "random bytes", "directory", "missing"])
def test_a_bad_model_file_is_refused_in_one_line(monkeypatch, tmp_path, case):
    path, says = _bad_files(tmp_path)[case]
    result, started = _launch(monkeypatch, "--model", path)
    _assert_refused(result, started, "--model", says)


@pytest.mark.parametrize("args, says", [
    (["--device", "bogus"], "unknown device 'bogus'"),
    (["--device", "vulkan:x"], "unknown device"),
    (["--policy", "bogus"], "unknown scheduling policy 'bogus'"),
    (["--policy", "fixed:0"], "--policy"),
    (["--theme", "nope"], "unknown theme 'nope'"),
    (["--n-ctx", "0"], "the smallest context is 256"),
    (["--n-ctx", "64"], "the smallest context is 256"),
    (["--n-ctx", "300"], "--n-ctx 512"),
    (["--threads", "0"], "--threads"),
    (["--temperature", "-1"], "--temperature"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--kv-disk-mb", "-1"], "--kv-disk-mb"),
    (["--kv-ram-mb", "-1"], "--kv-ram-mb"),
    (["--workdir", "/no/such/dir"], "no such directory"),
])
def test_a_bad_option_is_refused_in_one_line(monkeypatch, model, args, says):
    result, started = _launch(monkeypatch, "--model", model, *args)
    _assert_refused(result, started, args[0] if args[0] != "--n-ctx" else "--n-ctx", says)


def test_good_options_start_the_app(monkeypatch, model):
    result, started = _launch(monkeypatch, "--model", model, "--n-ctx", "512", "--threads", "1",
                              "--policy", "fixed:16", "--theme", "magnitude-paper")
    assert result.exit_code == 0, result.output
    assert started[0].backend.n_ctx == 512 and started[0].backend.model == model
    # Saved KV lives next to the database, with the default disk budget.
    assert started[0].warm_dir.endswith("kv") and started[0].warm_budget_mb == 1024
    result, started = _launch(monkeypatch, "--model", model, "--kv-disk-mb", "0")
    assert result.exit_code == 0 and started[0].warm_budget_mb == 0
    assert started[0].kv_ram_mb == 2048  # evicted conversations' KV in host memory, by default
    result, started = _launch(monkeypatch, "--model", model, "--kv-ram-mb", "0")
    assert result.exit_code == 0 and started[0].kv_ram_mb == 0


def test_check_prints_what_would_run_and_exits(monkeypatch, model):
    result, started = _launch(monkeypatch, "--model", model, "--check")
    assert result.exit_code == 0 and not started
    assert result.stdout.startswith(f"ok: model {model}")


def test_help_shows_flags_without_a_value(monkeypatch):
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    resume = next(line for line in result.output.splitlines() if "--resume" in line)
    assert "<bool>" not in resume


def test_vulkan_without_a_vulkan_device_is_refused(tmp_path, model):
    # A fresh process: the device registry is read once per process, and lavapipe is visible
    # only when GGML_VK_VISIBLE_DEVICES names it (other tests set it).
    need_real_model()
    env = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    probe = subprocess.run([sys.executable, "-c", "from backend import native; "
                            "print(any(d.backend == 'Vulkan' for d in native.list_devices()))"],
                           capture_output=True, text=True, env=env, timeout=120)
    if probe.stdout.strip() == "True":
        pytest.skip("this machine has a Vulkan device")
    done = subprocess.run([sys.executable, "-m", "magnitude_tui.cli", "--model", model, "--device", "vulkan",
                           "--check"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("magnitude-tui: --device vulkan: ") and "Vulkan" in done.stderr
