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


# What is kept of a server's stderr: its tail (failures quote its last few hundred characters).
STDERR_KEEP = 64 * 1024
# At most this much is read from the pipe at once when a failure is being said (a server that
# writes without pause must not hold the event loop).
_DRAIN_MAX = 4 * 1024 * 1024


class StderrLog:
    """A server's stderr: a pipe the app reads on its event loop as the server writes, of which the
    last STDERR_KEEP bytes are kept (a temporary file grew with a chatty server for the whole
    session). Offsets count every byte ever written, so an offset taken before a call still marks
    where that call's stderr begins after older bytes were dropped. One log serves every start of
    its server; POSIX only (`loop.add_reader` on a pipe)."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        self._fd = read_fd
        self.file = os.fdopen(write_fd, "w")  # what the SDK is given: the server's fd 2
        self._kept = bytearray()
        self.total = 0  # bytes written since the log was made
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def dropped(self) -> int:
        """Bytes written but no longer kept (the oldest)."""
        return self.total - len(self._kept)

    def watch(self) -> None:
        """Read the pipe on the running loop from now on (else a server that writes 64 KiB blocks)."""
        if self._loop is None and self._fd >= 0:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._read)

    def _read(self, limit: int = 65536) -> int:
        try:
            data = os.read(self._fd, limit)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            data = b""
        if not data:  # every writer gone (only after close: the log holds a write end)
            self._unwatch()
            return 0
        self.total += len(data)
        self._kept += data
        if len(self._kept) > STDERR_KEEP:
            del self._kept[:len(self._kept) - STDERR_KEEP]
        return len(data)

    def drain(self) -> int:
        """Take what is in the pipe now (the loop may not have read it yet); the offset of its end."""
        taken = 0
        while self._fd >= 0 and taken < _DRAIN_MAX:
            got = self._read()
            if not got:
                break
            taken += got
        return self.total

    def since(self, offset: int) -> tuple[str, int]:
        """What was written from `offset` on that is still kept (drained first), and how many of
        those bytes were dropped."""
        self.drain()
        start = max(offset, self.dropped)
        return bytes(self._kept[start - self.dropped:]).decode("utf-8", "replace"), start - offset

    def _unwatch(self) -> None:
        if self._loop is not None:
            try:
                self._loop.remove_reader(self._fd)
            except (RuntimeError, ValueError, OSError):  # the loop closed already
                pass
            self._loop = None

    def close(self) -> None:
        self._unwatch()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.file.close()


class _QuietParseErrors(logging.Filter):
    """The SDK logs a traceback for every stdout line that is not JSON-RPC (a server's banner):
    on `run`'s terminal that was a screenful per line. The server's problem says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Failed to parse JSONRPC message")


logging.getLogger("mcp.client.stdio").addFilter(_QuietParseErrors())
