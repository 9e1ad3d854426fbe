"""A newcomer's first day on the command line: options that would hang, exhaust the machine or
fail only after the engine started are refused before anything loads, in one line, exit 2."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

import magnitude_tui.app
import magnitude_tui.engine.client
import magnitude_tui.generate
from backend.model_file import default_model_path
from magnitude_tui import preflight
from magnitude_tui.cli import app
from tests.needs import need_real_model


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def gguf_trained_on(path: Path, context_length: int) -> Path:
    """A valid GGUF v3 file whose header says the model was trained on `context_length` tokens."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 3)
    header += _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    header += _string("llama.context_length") + struct.pack("<II", 4, context_length)
    header += _string("general.alignment") + struct.pack("<II", 4, 32)
    header += _string("weights") + struct.pack("<I", 1) + struct.pack("<Q", 64)
    header += struct.pack("<IQ", 0, 0)  # F32 at offset 0 of the data section
    header += b"\0" * (-len(header) % 32)
    path.write_bytes(header + struct.pack("<64f", *range(64)))
    return path


class Started:
    """Records every engine or app start the commands attempt (none may happen on a refusal)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, object]] = []
        monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: self.calls.append(("app", config)))
        monkeypatch.setattr(magnitude_tui.generate, "local_client",
                            lambda *a, **kw: self._refuse_start(("local_client", kw)))
        monkeypatch.setattr(magnitude_tui.engine.client, "WorkerClient",
                            lambda config, **kw: self._refuse_start(("worker", config)))

    def _refuse_start(self, call):
        self.calls.append(call)
        raise SystemExit(99)  # the command got as far as starting an engine


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _assert_one_line_refusal(result, started: Started, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert not started.calls, f"an engine or the app was started: {started.calls}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# ---- --ctx beyond the model's trained context ----------------------------------------------------

@pytest.mark.parametrize("command", [[], ["generate", "hi"], ["run", "hi"], ["serve"]])
@pytest.mark.parametrize("ctx", ["10000000", "65536"])
def test_a_context_beyond_what_its_sequences_can_use_is_refused_before_anything_loads(monkeypatch, tmp_path,
                                                                                     command, ctx):
    # --ctx 10000000 used to reach llama.cpp, which allocates and clears the whole KV cache at
    # load (230 GB for SmolLM2): "could not create a context" after the TUI opened at best, the
    # machine swapping or killed by the OOM killer at worst. The 16 sequences of a model trained
    # on 2,048 tokens can use 32,768 cells of the shared pool at most.
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    started = Started(monkeypatch)
    result = _invoke(*command, "--model", model, "--ctx", ctx)
    _assert_one_line_refusal(result, started, "--ctx", "16 sequences", "2,048", "--ctx 32768 or less")


@pytest.mark.parametrize("ctx", ["2048", "4096", "32768"])
def test_a_pool_up_to_what_its_sequences_can_use_is_accepted(monkeypatch, tmp_path, ctx):
    # --ctx is one pool all sequences share: more than the trained context is how several long
    # conversations fit (it was refused above 2,048 here for a while).
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    started = Started(monkeypatch)
    result = _invoke("--model", model, "--ctx", ctx)
    assert result.exit_code == 0, result.output
    assert started.calls[0][1].backend.n_ctx == int(ctx)


def test_serves_pool_is_bounded_by_its_parallel_sequences(monkeypatch, tmp_path):
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    started = Started(monkeypatch)
    result = _invoke("serve", "--model", model, "--parallel", "4", "--ctx", "16384")
    _assert_one_line_refusal(result, started, "4 sequences", "--ctx 8192 or less")


@pytest.mark.parametrize("trained, expected", [(2048, 2048), (1000, 768), (32768, 8192)])
def test_the_default_context_is_lowered_to_the_trained_one(monkeypatch, tmp_path, trained, expected):
    model = str(gguf_trained_on(tmp_path / "m.gguf", trained))
    started = Started(monkeypatch)
    result = _invoke("--model", model)
    assert result.exit_code == 0, result.output
    assert started.calls[0][1].backend.n_ctx == expected
    result = _invoke("--model", model, "--check")
    assert f"n_ctx {expected}," in result.stdout


def test_the_real_models_trained_context_bounds_ctx(monkeypatch):
    need_real_model()
    assert preflight.trained_context(default_model_path()) == 8192
    started = Started(monkeypatch)
    line = _assert_one_line_refusal(_invoke("generate", "hi", "--ctx", "10000000"), started, "8,192")
    assert "--ctx 131072 or less" in line


# ---- --threads beyond the CPUs -------------------------------------------------------------------

@pytest.mark.parametrize("command", [[], ["generate", "hi"], ["run", "hi"]])
def test_more_threads_than_cpus_are_refused(monkeypatch, tmp_path, command):
    # --threads 1000 on 2 CPUs was accepted, and `generate` then printed nothing for minutes:
    # ggml's threads spin at a barrier after every operation, 500 of them per core.
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    monkeypatch.setattr(preflight, "usable_cpus", lambda: 2)
    started = Started(monkeypatch)
    result = _invoke(*command, "--model", model, "--threads", "1000")
    _assert_one_line_refusal(result, started, "--threads", "1000", "2 CPUs", "--threads 2 or less")


def test_as_many_threads_as_cpus_are_accepted(monkeypatch, tmp_path):
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    monkeypatch.setattr(preflight, "usable_cpus", lambda: 2)
    started = Started(monkeypatch)
    result = _invoke("--model", model, "--threads", "2")
    assert result.exit_code == 0, result.output
    assert started.calls[0][1].backend.n_threads == 2


# ---- serve checks what the app checks ------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--ctx", "0"], "the smallest context is 256"),   # became 8192 without a word
    (["--ctx", "300"], "--n-ctx 512"),                  # became 512 without a word
    (["--device", "bogus"], "unknown device 'bogus'"),  # found by the worker, after the port opened
    (["--policy", "bogus"], "unknown scheduling policy 'bogus'"),
    (["--threads", "1000"], "--threads"),
    (["--kv-streams", "--ctx", "4096", "--parallel", "8"], "leaves each sequence 512 cells"),
])
def test_serve_refuses_bad_options_before_the_engine_starts(monkeypatch, tmp_path, args, says):
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    monkeypatch.setattr(preflight, "usable_cpus", lambda: 2)
    started = Started(monkeypatch)
    result = _invoke("serve", "--model", model, "--port", "9", *args)
    _assert_one_line_refusal(result, started, says)


def test_serve_with_good_options_starts_its_engine(monkeypatch, tmp_path):
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    started = Started(monkeypatch)
    result = _invoke("serve", "--model", model, "--port", "9", "--ctx", "1024", "--policy", "fixed:16")
    assert result.exit_code == 99 and started.calls[0][0] == "worker", result.output
    assert started.calls[0][1].backend.n_ctx == 1024 and not started.calls[0][1].backend.kv_streams
    result = _invoke("serve", "--model", model, "--port", "9", "--ctx", "4096", "--parallel", "2", "--kv-streams")
    assert result.exit_code == 99 and started.calls[1][1].backend.kv_streams, result.output


# ---- devices --attention -------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--device", "bogus"], "unknown device 'bogus'"),  # was a DeviceError traceback
    (["--threads", "1000"], "--threads"),
    (["--threads", "0"], "--threads"),                  # silently became the default
    (["--model", "MISSING"], "not found"),              # came after the device table
])
def test_devices_attention_refuses_bad_options_before_anything(monkeypatch, tmp_path, args, says):
    import backend.factory

    built: list = []
    monkeypatch.setattr(backend.factory, "build_backend", lambda *a, **kw: built.append(a))
    monkeypatch.setattr(preflight, "usable_cpus", lambda: 2)
    args = [str(tmp_path / "missing.gguf") if a == "MISSING" else a for a in args]
    if "--model" not in args:
        args += ["--model", str(gguf_trained_on(tmp_path / "m.gguf", 2048))]
    result = _invoke("devices", "--attention", *args)
    assert result.exit_code == 2 and not built, result.output
    assert result.stdout == "", "the table came before the refusal"
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert says in result.stderr and result.stderr.startswith("magnitude-tui: ")


# ---- --help says what the options are -------------------------------------------------------------

def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def _option_line(text: str, option: str) -> str:
    return next(line for line in text.splitlines() if f"{option} " in line)


def test_help_keeps_the_toml_table_names():
    # Rich markup took [role], [mcp.NAME] and [spawn] for tags and dropped them:
    # "Agent definitions (TOML:  system, ..." and "Agents file (roles,  servers,  limits; ...".
    assert "(TOML: [role] system, temperature, max_tokens;" in _option_line(_help(), "--agents")
    assert "(roles, [mcp.NAME] servers, [spawn] limits;" in _option_line(_help("run"), "--agents")


@pytest.mark.parametrize("command", [[], ["devices"], ["generate"], ["serve"], ["run"]])
def test_no_flag_is_shown_as_taking_a_value(command):
    import typer.main

    group = typer.main.get_command(app)
    cmd = group.commands[command[0]] if command else group  # type: ignore[attr-defined]
    flags = [p.opts[0] for p in cmd.params if getattr(p, "is_flag", False) and p.opts[0] != "--help"]
    assert flags, "no flags found: the test would check nothing"
    text = _help(*command)
    for flag in flags:
        assert "<bool>" not in _option_line(text, flag), (flag, _option_line(text, flag))


# ---- a data directory that cannot be one ---------------------------------------------------------

def test_a_file_where_the_data_directory_goes_is_named(monkeypatch, tmp_path):
    # SQLite said only "unable to open database file", which does not say what to move.
    monkeypatch.setattr(magnitude_tui.engine.client, "WorkerClient", lambda *a, **kw: pytest.fail("it started"))
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    model = str(gguf_trained_on(tmp_path / "m.gguf", 2048))
    result = CliRunner().invoke(app, ["--model", model], env={"XDG_DATA_HOME": str(blocker)})
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"{blocker} is a file, not a directory" in lines[0]
    assert blocker.read_text() == "not a directory"  # left as it was


def test_threads_are_not_counted_against_this_machine_for_a_remote_engine(monkeypatch):
    # --threads is a local engine's; with --remote it was refused for this machine's CPU count.
    monkeypatch.setattr(preflight, "usable_cpus", lambda: 2)
    result = _invoke("--remote", "http://127.0.0.1:9", "--threads", "8", "--check")
    assert result.exit_code == 0 and "ok: remote http://127.0.0.1:9" in result.stdout, result.output


def test_only_the_llama_backend_takes_kv_streams_and_a_share_is_rounded_as_llama_cpp_rounds_it():
    from backend.factory import BackendConfig

    with pytest.raises(ValueError, match="needs the llama backend"):
        BackendConfig("fake", kv_streams=True)
    assert BackendConfig("llama", kv_streams=True).kv_streams
    preflight.check_streams(3000, 3)  # 1,000 cells each, rounded up to 1,024 by llama.cpp
    with pytest.raises(preflight.OptionError, match="leaves each sequence 768 cells"):
        preflight.check_streams(2600, 4)
