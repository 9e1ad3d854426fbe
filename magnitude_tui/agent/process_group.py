"""Provides group_running, wait_gone and end_group: whether a process group still has a live process, waiting (bounded) until it has none, and ending one (SIGTERM, then SIGKILL) (the run_command tool's shell and what it started, an MCP server and its children, a paired bench's side and its server)."""

from __future__ import annotations

import asyncio
import os
import signal


def group_running(pgid: int) -> bool:
    """Whether a process of the group still runs. A zombie (ended, not yet reaped by its new
    parent) does not count; where /proc is missing, any member does."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


async def wait_gone(pgid: int, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Wait until no process of the group runs, at most `timeout_s`; whether it is gone."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while group_running(pgid):
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


async def end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM what is left of a process group, then SIGKILL what outlives `grace_s` (cancelled
    while waiting too: nothing of it is left running). Never this process's own group."""
    if not hasattr(os, "killpg") or pgid <= 1 or pgid == os.getpgrp() or not group_running(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
        await wait_gone(pgid, grace_s)
    except (ProcessLookupError, PermissionError):
        return
    finally:
        if group_running(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
