"""Provides an MCP server's process side: its pid recorded as the SDK starts it, and what is left of its process group ended."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import signal
from typing import Iterable

# After a server ends, what is left of its process group gets this long after SIGTERM, then SIGKILL.
GROUP_TERM_WAIT_S = 1.0

# The pid of the process the SDK starts, for the task that starts it (the SDK does not say it). The
# SDK starts each server in its own session (process group = its pid) but kills that group only
# when the server itself does not end: a server that ends at once on EOF left its own children running.
_SPAWNED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("mcp_spawned", default=None)


def hook_spawn() -> None:
    """Wrap the SDK's (private) process start so that it records the pid; a rename of that function
    in the SDK fails tests/test_mcp_restart_faults.py, not the cleanup silently."""
    try:
        import mcp.client.stdio as sdk
    except ImportError:  # pragma: no cover
        return
    original = getattr(sdk, "_create_platform_compatible_process", None)
    if original is None or getattr(original, "_records_pid", False):
        return

    async def spawn(*args, **kwargs):
        process = await original(*args, **kwargs)
        box = _SPAWNED.get()
        if box is not None:
            box.append(process.pid)
        return process

    spawn._records_pid = True  # type: ignore[attr-defined]
    sdk._create_platform_compatible_process = spawn


def record_spawns() -> list[int]:
    """The list that the pids of the processes this task (and the tasks it starts) spawns are added to."""
    hook_spawn()
    spawned: list[int] = []
    _SPAWNED.set(spawned)
    return spawned


def terminate_groups(pids: Iterable[int]) -> None:
    """SIGTERM each process group now (the SDK would wait 2 s for a server that does not answer to end)."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def end_group(pgid: int) -> None:
    """SIGTERM what is left of the server's process group, then SIGKILL what outlives GROUP_TERM_WAIT_S."""
    if not hasattr(os, "killpg") or pgid <= 1 or pgid == os.getpgrp() or not _group_alive(pgid):
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GROUP_TERM_WAIT_S
        while _group_alive(pgid) and loop.time() < deadline:
            await asyncio.sleep(0.02)
    except (ProcessLookupError, PermissionError):
        return
    finally:  # cancelled while waiting too: nothing of it is left running
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class _QuietParseErrors(logging.Filter):
    """The SDK logs a traceback for every stdout line that is not JSON-RPC (a server's banner):
    on `run`'s terminal that was a screenful per line. The server's problem says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to parse JSONRPC message")


logging.getLogger("mcp.client.stdio").addFilter(_QuietParseErrors())
