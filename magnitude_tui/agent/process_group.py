"""Provides group_running and wait_gone: whether a process group still has a live process, and waiting (bounded) until it has none (the run_command tool's shell and what it started, an MCP server and its children)."""

from __future__ import annotations

import asyncio
import os


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
