"""Provides run_command: a shell command in the workspace root, in its own process group, with a timeout and an output cap."""

from __future__ import annotations

import asyncio
import os
import signal

from magnitude_tui.agent.policy import ToolKind
from magnitude_tui.agent.toolbox import AgentTool, ToolResult, function_tool
from magnitude_tui.agent.workspace import Workspace

# After SIGTERM to the group, how long its processes get before SIGKILL.
TERM_GRACE_S = 1.0


def _kill_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the shell's pid
    except (ProcessLookupError, PermissionError):
        pass


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """End the command and everything it started (a cancelled pane, a timeout)."""
    _kill_group(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), TERM_GRACE_S)
    except asyncio.TimeoutError:
        pass
    _kill_group(proc, signal.SIGKILL)  # also whatever the shell left behind in the group
    if proc.returncode is None:
        await proc.wait()


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """The first `cap` bytes, and how many more came (read to the end so the command never blocks)."""
    kept, extra = bytearray(), 0
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        kept += chunk[:max(room, 0)]
        extra += max(len(chunk) - max(room, 0), 0)
    return bytes(kept), extra


class CommandTool:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def tool(self) -> AgentTool:
        return AgentTool(function_tool(
            "run_command", "Run a shell command in the workspace root; returns its exit status and output.",
            {"command": {"type": "string"},
             "timeout_s": {"type": "number", "exclusiveMinimum": 0}}, ["command"]),
            ToolKind.RUN, self.run)

    async def run(self, args: dict) -> ToolResult:
        limit = self.ws.limits.command_timeout_s
        timeout = min(float(args.get("timeout_s") or limit), limit)
        try:
            proc = await asyncio.create_subprocess_shell(
                args["command"], cwd=self.ws.root, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            return ToolResult.failed(f"the command could not start: {e}")
        cap = self.ws.limits.output_chars
        assert proc.stdout is not None  # stdout=PIPE
        reader = asyncio.ensure_future(_read_capped(proc.stdout, cap))
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            await _stop(proc)
            out, extra = await reader
            return ToolResult(_render(out, extra, f"killed after {timeout:g} s (timeout)"), ok=False)
        except BaseException:  # cancelled (esc, the pane closed): the whole group goes
            await asyncio.shield(_stop(proc))
            reader.cancel()
            raise
        # What the command left running in its group would hold the output pipe open forever.
        _kill_group(proc, signal.SIGKILL)
        out, extra = await reader
        return ToolResult(_render(out, extra, f"exit status {proc.returncode}"), ok=proc.returncode == 0)


def _render(out: bytes, extra: int, status: str) -> str:
    text = out.decode("utf-8", errors="replace")
    more = f"\n[{extra} more bytes of output not shown]" if extra else ""
    return f"{status}\n{text}{more}"
