"""Provides group_running: whether a process group still has a live process (the run_command tool's shell and what it started, an MCP server and its children)."""

from __future__ import annotations

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
