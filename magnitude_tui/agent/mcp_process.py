"""Provides an MCP server's process side: its pid recorded as the SDK starts it, its stdout read in whole lines (a message over MAX_MESSAGE_BYTES not held), its stderr's tail kept (StderrLog), and what is left of its process group ended."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import re
import signal
from signal import Signals
from typing import Any, Iterable

import anyio
from anyio.abc import ByteReceiveStream, Process

# After a server ends, what is left of its process group gets this long after SIGTERM, then SIGKILL.
GROUP_TERM_WAIT_S = 1.0

# The pid of the process the SDK starts, for the task that starts it (the SDK does not say it). The
# SDK starts each server in its own session (process group = its pid) but kills that group only
# when the server itself does not end: a server that ends at once on EOF left its own children running.
_SPAWNED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("mcp_spawned", default=None)


def hook_spawn() -> None:
    """Wrap the SDK's (private) process start so that it records the pid and reads the server's
    stdout in whole lines (`WholeLines`); a rename of that function in the SDK fails
    tests/test_mcp_restart_faults.py, not the cleanup silently."""
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
        if box is None:  # not one of McpServer's starts: left as the SDK made it
            return process
        box.append(process.pid)
        return LinesProcess(process)

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


# A message from a server longer than this is not read: a call it answers fails (said), and
# nothing else of it is kept. Results are cut at 64,000 characters for the model anyway.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# What is kept of a line past MAX_MESSAGE_BYTES: its start and its end, where a response's id is.
_ENDS = 512
_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_ID_AT_START = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_ID_AT_END = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*\}\s*$')


class WholeLines(ByteReceiveStream):
    """A server's stdout as the SDK's reader takes it: each receive ends at a line's end, a line's
    pieces joined once. The SDK joins a line's 64 KiB pieces one by one (`buffer + chunk`, then a
    split of it all), which is quadratic: a 64 MB result took 29 s, the event loop stalling up to
    0.2 s at a time. A line over MAX_MESSAGE_BYTES is not held: it becomes a JSON-RPC error answer
    to its request (its id read from its start, as the Python SDK writes it, or its end, as the
    TypeScript one does), or, without an id found, is dropped."""

    def __init__(self, inner: ByteReceiveStream) -> None:
        self._inner = inner
        self._parts: list[bytes] = []
        self._size = 0  # of the line not ended yet
        self._head = b""  # past MAX_MESSAGE_BYTES: its first _ENDS bytes and its last
        self._tail = b""
        self._over = False

    def _pend(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._over:
            self._tail = (self._tail + piece)[-_ENDS:]
            return
        self._parts.append(piece)
        if self._size > MAX_MESSAGE_BYTES:
            held = b"".join(self._parts)
            self._head, self._tail, self._parts, self._over = held[:_ENDS], held[-_ENDS:], [], True

    def _line(self) -> bytes:
        """The line ended now (with its newline), or what stands for it."""
        if self._over:
            out = too_long(self._head, self._tail, self._size)
        else:
            out = b"".join(self._parts) + b"\n"
        self._parts, self._size, self._head, self._tail, self._over = [], 0, b"", b"", False
        return out

    async def receive(self, max_bytes: int = 65536) -> bytes:
        while True:
            try:
                chunk = await self._inner.receive(max_bytes)
            except anyio.EndOfStream:
                if self._size and not self._over:  # a last line without its newline: as it came
                    rest, self._parts, self._size = b"".join(self._parts), [], 0
                    return rest
                raise
            first = chunk.find(b"\n")
            if first < 0:
                self._pend(chunk)
                continue
            self._pend(chunk[:first])
            line = self._line()
            last = chunk.rfind(b"\n")
            if last > first:  # whole lines within this piece
                line += chunk[first + 1:last + 1]
            if last + 1 < len(chunk):
                self._pend(chunk[last + 1:])
            if line:
                return line

    async def aclose(self) -> None:
        await self._inner.aclose()


def too_long(head: bytes, tail: bytes, size: int) -> bytes:
    """What stands for a line over MAX_MESSAGE_BYTES: an error answer to its request, or nothing."""
    found = _ID_AT_START.match(head) or _ID_AT_END.search(tail)
    if found is None:
        return b""
    try:
        rid = json.loads(found.group(1))
    except ValueError:
        return b""
    message = (f"the server's answer was {size:,} bytes, over the {MAX_MESSAGE_BYTES:,} this client reads "
               "(MAX_MESSAGE_BYTES): it was not read")
    error = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": message}}
    return json.dumps(error).encode() + b"\n"


class LinesProcess(Process):
    """The SDK's server process, its stdout read through WholeLines; the rest is the process's own."""

    def __init__(self, inner: Process) -> None:
        self._inner = inner
        self._lines = WholeLines(inner.stdout) if inner.stdout is not None else None

    def __getattr__(self, name: str) -> Any:  # the SDK reaches for the asyncio transport (`_process`)
        return getattr(self._inner, name)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def wait(self) -> int:
        return await self._inner.wait()

    def terminate(self) -> None:
        self._inner.terminate()

    def kill(self) -> None:
        self._inner.kill()

    def send_signal(self, signal: Signals) -> None:
        self._inner.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._inner.pid

    @property
    def returncode(self) -> int | None:
        return self._inner.returncode

    @property
    def stdin(self):
        return self._inner.stdin

    @property
    def stdout(self):
        return self._lines

    @property
    def stderr(self):
        return self._inner.stderr


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
