"""A crash inside the app (an unexpected exception Textual caught and printed) ends the command
with exit 1 and a line saying so. It exited 0 after the traceback, so a script or a supervisor
took a crash for a normal quit."""

from __future__ import annotations

import signal

import pytest
from typer.testing import CliRunner

import magnitude_tui.app
from magnitude_tui.cli import app as cli


class _CrashingApp:
    failure = None
    return_code = None
    signalled = None  # not ended by SIGHUP or SIGTERM

    def __init__(self, **kw) -> None:
        pass

    def run(self) -> None:
        self.return_code = 1  # what Textual sets when an exception ended the app


class _Client:
    def stop(self) -> None:
        pass


def test_a_crash_in_the_app_exits_1(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(magnitude_tui.app, "MagnitudeApp", _CrashingApp)
    failure = magnitude_tui.app.run_app(_Client(), theme=None, resume=False)
    assert failure == "the app stopped on an unexpected error (its traceback is above)"
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda *a, **kw: failure)
    result = CliRunner().invoke(cli, ["--threads", "1"])
    assert result.exit_code == 1 and "unexpected error" in result.stderr


class _SignalledApp(_CrashingApp):
    def run(self) -> None:
        self.signalled = signal.SIGTERM  # what the app's handler records before it exits
        self.return_code = 128 + signal.SIGTERM


def test_an_app_ended_by_sigterm_exits_143_after_stopping_the_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(magnitude_tui.app, "MagnitudeApp", _SignalledApp)
    stopped = []
    client = _Client()
    client.stop = lambda: stopped.append(True)  # type: ignore[method-assign]
    with pytest.raises(SystemExit) as ended:
        magnitude_tui.app.run_app(client, theme=None, resume=False)
    assert ended.value.code == 143 and stopped
