"""Provides McpServers: stdio MCP servers from agents.toml (official `mcp` SDK), their tools as AgentTools; a failing server only marks its tools unavailable."""

from __future__ import annotations

import asyncio
import builtins
import json
import re
import tempfile
from typing import TYPE_CHECKING, Sequence

from magnitude_tui.agent.config import McpServerSpec
from magnitude_tui.agent.policy import ToolKind
from magnitude_tui.agent.toolbox import AgentTool, ToolResult
from scheduler.types import Tool

if TYPE_CHECKING:
    from mcp import ClientSession

_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+; the SDK backports it on 3.10

# How long a server gets to end after it is told to (then it is cancelled, which kills it).
CLOSE_WAIT_S = 5.0


def tool_name(server: str, tool: str) -> str:
    """The function name the model sees: server and tool, within OpenAI's name rules."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")
    return clean[:64]


class McpServer:
    """One stdio server, held open by its own task (the SDK's streams must close in the task that
    opened them). `problem` says why its tools cannot be used (None: they can)."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.problem: str | None = None
        self.tools: list = []  # mcp.types.Tool, as the server listed them
        self._session: ClientSession | None = None
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")

    async def start(self) -> None:
        """Start the server and list its tools, or set `problem`; never raises."""
        self._task = asyncio.create_task(self._serve(), name=f"mcp-{self.spec.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.spec.start_timeout_s)
        except asyncio.TimeoutError:
            self._fail(f"it did not start within {self.spec.start_timeout_s:g} s")
            await self.close()

    async def _serve(self) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        params = StdioServerParameters(command=self.spec.command, args=list(self.spec.args),
                                       env={**get_default_environment(), **dict(self.spec.env)})
        try:
            async with stdio_client(params, errlog=self._errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    listed = await session.list_tools()
                    self.tools, self._session = list(listed.tools), session
                    self._ready.set()
                    await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # an ExceptionGroup from the SDK's task group included
            self._fail(f"it failed: {_first_error(e)}")
        finally:
            self._session = None
            if not self._stop.is_set():
                self._fail("it stopped")
            self._ready.set()

    def _fail(self, why: str, stderr_since: int = 0) -> None:
        if self.problem is None:
            self.problem = f"MCP server {self.spec.name!r}: {why}{self._stderr_tail(stderr_since)}"

    def _stderr_size(self) -> int:
        try:
            self._errlog.flush()
            return self._errlog.seek(0, 2)
        except (OSError, ValueError):
            return 0

    def _stderr_tail(self, since: int = 0) -> str:
        """The end of what the server wrote on stderr from offset `since` (a call's failure names only
        what the server said during that call, not an earlier call's noise)."""
        try:
            self._errlog.flush()
            self._errlog.seek(since)
            tail = self._errlog.read()[-400:].strip()
        except (OSError, ValueError):
            return ""
        return f" (stderr: {tail})" if tail else ""

    async def call(self, name: str, args: dict) -> ToolResult:
        if self.problem is not None or self._session is None:
            return ToolResult.failed(f"unavailable: {self.problem or 'the server is not running'}")
        since = self._stderr_size()
        try:
            result = await asyncio.wait_for(self._session.call_tool(name, args), self.spec.timeout_s)
        except asyncio.TimeoutError:
            self._fail(f"{name} did not answer within {self.spec.timeout_s:g} s", since)
            return ToolResult.failed(f"unavailable: {self.problem}")
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if _answered_with_error(e) and self._session is not None:
                # The server answered this call with a JSON-RPC error (bad params, a tool that threw in
                # another SDK): the call failed, the server is still there for the others.
                return ToolResult.failed(f"{name} failed: {_first_error(e)}")
            self._fail(f"{name} failed: {_first_error(e)}", since)
            return ToolResult.failed(f"unavailable: {self.problem}")
        return _result(result)

    def agent_tools(self) -> list[AgentTool]:
        out = []
        for t in self.tools:
            hints = t.annotations
            kind = ToolKind.READ if hints is not None and hints.read_only_hint else ToolKind.RUN

            async def run(args: dict, _name: str = t.name) -> ToolResult:
                return await self.call(_name, args)

            out.append(AgentTool(Tool(tool_name(self.spec.name, t.name), t.description or "",
                                      json.dumps(t.input_schema or {"type": "object"})), kind, run,
                                 unavailable=self.problem))
        return out

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
            except (asyncio.TimeoutError, Exception):
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        self._errlog.close()


def _result(result) -> ToolResult:
    parts = []
    for c in getattr(result, "content", None) or []:
        text = getattr(c, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(c, 'type', 'content')} not shown]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    return ToolResult(f"error: {text}" if getattr(result, "is_error", False) else text,
                      ok=not getattr(result, "is_error", False))


def _answered_with_error(e: BaseException) -> bool:
    """Whether `e` is the server's JSON-RPC error answer to a call (not a lost connection or a timeout
    the SDK raises itself, after which the server cannot be trusted to answer)."""
    try:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
    except ImportError:  # pragma: no cover - mcp 1.x spells it McpError
        from mcp.shared.exceptions import McpError as MCPError  # type: ignore[attr-defined,no-redef]
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
    return isinstance(e, MCPError) and e.error.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def _first_error(e: BaseException) -> str:
    while _GROUP and isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:300]


class McpServers:
    """Every configured server of one run (or app)."""

    def __init__(self, specs: Sequence[McpServerSpec]) -> None:
        self.servers = [McpServer(s) for s in specs]

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.servers))

    @property
    def problems(self) -> dict[str, str]:
        """Server name -> why its tools are unavailable."""
        return {s.spec.name: s.problem for s in self.servers if s.problem is not None}

    def tools(self) -> dict[str, list[AgentTool]]:
        """Server name -> its tools (those of a server that never started: none)."""
        return {s.spec.name: s.agent_tools() for s in self.servers}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers))
