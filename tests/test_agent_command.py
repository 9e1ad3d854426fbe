"""The run_command tool: the workspace root, the exit status, capped output, timeouts and
cancellation (a cancel during the shell's start too) ending the command's whole process group."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from magnitude_tui.agent.command import CommandTool
from magnitude_tui.agent.process_group import group_running
from magnitude_tui.agent.workspace import Limits, Workspace


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return Workspace(root, Limits(command_timeout_s=5.0, output_chars=200))


def tools(ws):
    return {"run_command": CommandTool(ws).tool()}


def run(ws, name, **args):
    return asyncio.run(tools(ws)[name].run(args))


def test_run_command_runs_in_the_root_with_its_exit_status(ws):
    r = run(ws, "run_command", command="pwd; echo err >&2; exit 3")
    assert not r.ok and r.text.startswith("exit status 3") and str(ws.root) in r.text and "err" in r.text


def test_run_command_output_is_capped(ws):
    r = run(ws, "run_command", command="yes | head -c 100000")
    assert r.ok and "more bytes of output not shown" in r.text and len(r.text) < 400


def test_run_command_timeout_kills_the_whole_group(ws):
    marker = ws.root / "child-alive"
    t0 = time.monotonic()
    r = run(ws, "run_command", command=f"(sleep 3; touch {marker}) & sleep 30", timeout_s=0.5)
    assert not r.ok and "timeout" in r.text and time.monotonic() - t0 < 4
    time.sleep(3.2)
    assert not marker.exists()  # the background child died with the group


def test_a_background_job_does_not_hold_the_command_past_its_end(ws):
    # The job holds the output pipe open; the command still ends when its shell does, and the
    # job dies with its group.
    marker = ws.root / "job-alive"
    t0 = time.monotonic()
    r = run(ws, "run_command", command=f"(sleep 2; touch {marker}) & echo started")
    assert r.ok and r.text == "exit status 0\nstarted\n" and time.monotonic() - t0 < 1.5, r.text
    time.sleep(2.5)
    assert not marker.exists()


@pytest.mark.serial
@pytest.mark.timeout(30)
def test_a_process_that_leaves_the_group_cannot_hold_the_command_open(ws):
    # A new session escapes the group kill and keeps the output pipe: reading stops, and says why.
    script = "import os, time; os.setsid(); open('pid', 'w').write(str(os.getpid())); time.sleep(30)"
    t0 = time.monotonic()
    r = run(ws, "run_command", command=f"{sys.executable} -c \"{script}\" & sleep 0.5; echo started",
            timeout_s=3)
    try:
        assert r.ok and r.text.startswith("exit status 0\nstarted\n") and "still holds it open" in r.text, r.text
        assert time.monotonic() - t0 < 3
    finally:
        os.kill(int((ws.root / "pid").read_text()), signal.SIGKILL)


async def _written_pid(pidfile) -> int:
    """The pid a command wrote to `pidfile`, once it is there (up to 4 s)."""
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        await asyncio.sleep(0.02)
    return int(pidfile.read_text())


async def test_cancelling_run_command_kills_its_process_group(ws):
    pidfile = ws.root / "pid"
    task = asyncio.create_task(tools(ws)["run_command"].run({"command": f"sleep 30 & echo $! > {pidfile}; wait"}))
    pid = await _written_pid(pidfile)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # SIGKILL is delivered at once; reaping by init may take a moment
            os.kill(pid, 0)
            await asyncio.sleep(0.02)


async def test_a_command_cancelled_while_it_is_being_started_is_stopped_too(ws, monkeypatch):
    """The shell runs before create_subprocess_shell returns (its pipes are connected after the
    fork): a cancel in that window must still stop it, not leave it running with nobody to end it."""
    import magnitude_tui.agent.command as command

    real = asyncio.create_subprocess_shell
    slow_start = asyncio.Event()

    async def started_slowly(*args, **kwargs):
        proc = await real(*args, **kwargs)
        slow_start.set()
        await asyncio.sleep(1.5)  # the pipes' set-up, stretched so the cancel lands in it
        return proc

    monkeypatch.setattr(command.asyncio, "create_subprocess_shell", started_slowly)
    pidfile = ws.root / "pid"
    task = asyncio.create_task(tools(ws)["run_command"].run({"command": f"echo $$ > {pidfile}; sleep 30"}))
    await asyncio.wait_for(slow_start.wait(), 10)
    pgid = await _written_pid(pidfile)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 60)
    assert not group_running(pgid), "the command outlived its cancelled start"
