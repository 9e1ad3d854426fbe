"""Provides McpServers: stdio MCP servers from agents.toml (official `mcp` SDK), their tools as AgentTools; a failing server or tool fails alone."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from typing import TYPE_CHECKING, Sequence

from magnitude_tui.agent.config import McpServerSpec
from magnitude_tui.agent.mcp_process import GROUP_TERM_WAIT_S, StderrLog, record_spawns, terminate_groups
from magnitude_tui.agent.mcp_results import (
    answered_with_error,
    first_error,
    malformed_answer,
    offered_schema,
    tool_result,
    unique_name,
)
from magnitude_tui.agent.policy import ToolKind
from magnitude_tui.agent.process_group import end_group
from magnitude_tui.agent.toolbox import AgentTool, ToolResult
from scheduler.types import Tool

if TYPE_CHECKING:
    from mcp import ClientSession

# How long a server gets to end after it is told to (then it is cancelled, which kills it).
CLOSE_WAIT_S = 5.0
# A call that outlives timeout_s: the server is asked for a ping this long; one that answers is
# still up (only that call failed), one that does not is stopped and started again at the next call.
PING_WAIT_S = 5.0
# A server that died (or stopped answering) is started again at its next call, up to this many
# times in a row without an answer in between (a result, an error answer, one off the MCP schema,
# or a ping answered after a call timed out); then its tools stay unavailable.
MAX_RESTARTS = 3
# A server whose tools are unavailable (it failed to start, or used up its restarts) is tried again
# by `McpServers.retry` (the TUI: when an agent starts), at the earliest RETRY_FACTOR times as long
# after its failure as its last start took (at least RETRY_MIN_S), doubled at each try that fails
# again, at most RETRY_MAX_S: a server that always fails takes a small share of the agents' starts.
RETRY_FACTOR = 10.0
RETRY_MIN_S = 5.0
RETRY_MAX_S = 600.0


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
        self._errlog = StderrLog()  # its last STDERR_KEEP bytes, over all its starts
        self._not_jsonrpc: str | None = None  # the first stdout line that was not JSON-RPC
        self._started = False  # it once listed its tools (then it may be started again)
        self._restarts = 0  # in a row, without a call answered in between
        self._restart_lock = asyncio.Lock()
        self._pids: list[int] = []  # the process the SDK started (its group's id)
        self._closed = False  # closed for good: never started again
        self._failed_at = 0.0  # when `problem` was set (time.monotonic)
        self._start_s = 0.0  # how long its last start took
        self._failed_retries = 0  # tries again (`retry`) that failed, in a row

    async def start(self) -> None:
        """Start the server and list its tools, or set `problem`; never raises."""
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        self._errlog.watch()
        # The SDK is imported before the server's clock starts, and off the event loop: its first
        # import takes about 0.7 s on a 2-core machine, which a 1 s start_timeout_s charged to the
        # server (whose banner then arrived after the timeout and went unsaid), and which froze
        # the app's screen while it ran on the loop.
        if "mcp.client.stdio" not in sys.modules:
            await asyncio.to_thread(importlib.import_module, "mcp.client.stdio")
        began = time.monotonic()
        self._task = asyncio.create_task(self._serve(), name=f"mcp-{self.spec.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), self.spec.start_timeout_s)
        except asyncio.CancelledError:  # Ctrl-C while it starts (an `npx -y` download): it goes too
            await self._halt()
            raise
        except asyncio.TimeoutError:
            said = f"; what it wrote on stdout is not JSON-RPC: {self._not_jsonrpc!r}" if self._not_jsonrpc else ""
            self._fail(f"it did not start within {self.spec.start_timeout_s:g} s{said}")
            # It never answered: there is no session to end politely (waiting CLOSE_WAIT_S more
            # made a server that never answers `initialize` cost start_timeout_s + 7 s).
            await self._halt()
        finally:
            self._start_s = time.monotonic() - began
        if self.problem is None:
            self._started = True

    async def _serve(self) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        spawned = self._pids = record_spawns()
        # A byte that is not UTF-8 in the server's output is shown as U+FFFD ("strict" ended the
        # SDK's reader: the call then hung until timeout_s and the server was lost).
        params = StdioServerParameters(command=self.spec.command, args=list(self.spec.args),
                                       env={**get_default_environment(), **dict(self.spec.env)},
                                       encoding_error_handler="replace")
        try:
            async with stdio_client(params, errlog=self._errlog.file) as (read, write):
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    await session.initialize()
                    self.tools, self._session = await _list_tools(session), session
                    self._ready.set()
                    await self._stop.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # an ExceptionGroup from the SDK's task group included
            self._fail(f"it failed: {first_error(e)}")
        finally:
            self._session = None
            if not self._stop.is_set():
                self._fail("it stopped")
            self._ready.set()
            for pid in spawned:  # its children: what it started and left behind when it ended
                await end_group(pid, GROUP_TERM_WAIT_S)

    async def _on_message(self, message) -> None:
        if isinstance(message, Exception) and self._not_jsonrpc is None:
            errors = getattr(message, "errors", None)
            line = None
            if callable(errors):
                try:
                    line = errors()[0].get("input")
                except Exception:
                    line = None
            self._not_jsonrpc = str(line if isinstance(line, str) else message)[:200]

    def _fail(self, why: str, stderr_since: int = 0) -> None:
        if self.problem is None:
            self.problem = f"MCP server {self.spec.name!r}: {why}{self._stderr_tail(stderr_since)}"
            self._failed_at = time.monotonic()

    @property
    def given_up(self) -> bool:
        """Its tools are unavailable until it is tried again (`retry`): it failed to start, or died
        more than MAX_RESTARTS times in a row."""
        return (self.problem is not None and not self._closed
                and (not self._started or self._restarts >= MAX_RESTARTS))

    def retry_wait(self) -> float:
        """How long after its failure a server given up on is tried again."""
        wait = max(RETRY_MIN_S, RETRY_FACTOR * self._start_s) * 2 ** min(self._failed_retries, 20)
        return min(RETRY_MAX_S, wait)

    def retry_in(self, now: float | None = None) -> float:
        """Seconds until it may be tried again (0: now)."""
        now = time.monotonic() if now is None else now
        return max(0.0, self._failed_at + self.retry_wait() - now)

    async def retry(self) -> bool:
        """Start a server given up on again, its restarts counted afresh; whether it runs now."""
        async with self._restart_lock:
            if not self.given_up:
                return self.problem is None
            await self._halt()
            self.problem, self._not_jsonrpc, self._restarts = None, None, 0
            await self.start()
            if self._closed:
                await self._halt()
                self._fail("it was closed")
            if self.problem is None:
                self._failed_retries = 0
                return True
            self._failed_retries += 1
            return False

    def _stderr_size(self) -> int:
        return self._errlog.drain()

    def _stderr_tail(self, since: int = 0) -> str:
        """The end of what the server wrote on stderr from offset `since` (a call's failure names only
        what the server said during that call, not an earlier call's noise), and how much of that
        was not kept (only the log's last STDERR_KEEP bytes are)."""
        text, dropped = self._errlog.since(since)
        tail = text[-400:].strip()
        if not tail:
            return ""
        cut = f"; {dropped:,} earlier bytes of it not kept" if dropped else ""
        return f" (stderr: {tail}{cut})"

    async def _revive(self) -> bool:
        """Start a server that died (or stopped answering) again, at most MAX_RESTARTS times in a
        row; whether it runs now."""
        async with self._restart_lock:
            if self._session is not None and self.problem is None:
                return True  # another call started it meanwhile
            if self._closed or not self._started or self._restarts >= MAX_RESTARTS:
                return False
            self._restarts += 1
            await self._halt()
            before = self.problem
            self.problem = None
            await self.start()
            if self._closed:  # closed while it started again (the app quit): it goes too
                await self._halt()
                self._fail("it was closed")
            if self.problem is not None:
                self.problem = f"{self.problem} (started again after: {before})" if before else self.problem
                return False
            return True

    async def call(self, name: str, args: dict) -> ToolResult:
        if (self.problem is not None or self._session is None) and not await self._revive():
            return ToolResult.failed(f"unavailable: {self.problem or 'the server is not running'}")
        session = self._session
        if session is None:  # it ended again at once
            return ToolResult.failed(f"unavailable: {self.problem or 'the server is not running'}")
        since = self._stderr_size()
        try:
            result = await asyncio.wait_for(_call_tool(session, name, args), self.spec.timeout_s)
        except asyncio.TimeoutError:
            late = f"{name} did not answer within {self.spec.timeout_s:g} s"
            if await self._answers_ping(session):
                # The server is still there (the tool is slow, or stuck in its own thread): this
                # call failed, its other tools go on. It answered (a ping): as after any answer, it
                # is not a server that keeps dying, and a later crash gets its full restarts.
                if session is self._session:
                    self._restarts = 0
                return ToolResult.failed(f"{late}; the call was given up (the server still answers)"
                                         f"{self._stderr_tail(since)}")
            return await self._lose(session, f"{late}, and then not a ping either", since, halt=True)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if answered_with_error(e) and self._session is not None:
                # The server answered this call with a JSON-RPC error (bad params, a tool that threw in
                # another SDK): the call failed, the server is still there for the others.
                self._restarts = 0  # an answer: it is not a server that keeps dying
                return ToolResult.failed(f"{name} failed: {first_error(e)}")
            if malformed_answer(e) and self._session is not None:
                # It answered, in a shape the MCP schema does not allow: that answer is lost, not
                # the server (starting it again lost its state: a browser's pages, a login).
                self._restarts = 0
                return ToolResult.failed(f"{name}: the server's answer does not follow the MCP schema: "
                                         f"{first_error(e)}")
            return await self._lose(session, f"{name} failed: {first_error(e)}", since)
        self._restarts = 0
        return tool_result(result)

    async def _lose(self, session: ClientSession, why: str, since: int, *, halt: bool = False) -> ToolResult:
        """The server is lost (`why`), as the call to `session` found: failed, and stopped with `halt`.
        Only while `session` is still the server's: a call that failed late, on a server another call
        already found lost and started again, must not fail or stop the new one."""
        if session is not self._session:
            if self._session is None and self.problem is not None:
                return self._lost()
            return ToolResult.failed(f"{why}{self._stderr_tail(since)}; the server was started again since")
        self._fail(why, since)
        if halt:
            await self._halt()
        return self._lost()

    def _lost(self) -> ToolResult:
        """The result of a call the server was lost in (it died, or stopped answering)."""
        if self._restarts < MAX_RESTARTS:  # not "unavailable": the model would give its other tools up
            return ToolResult.failed(f"{self.problem}; the server is started again at the next call to any of its tools")
        return ToolResult.failed(f"unavailable: {self.problem}")

    async def _answers_ping(self, session: ClientSession) -> bool:
        try:
            await asyncio.wait_for(session.send_ping(), min(PING_WAIT_S, self.spec.timeout_s))
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            return answered_with_error(e)  # an error answer is an answer (a server without ping)
        return True

    def agent_tools(self, taken: set[str] | None = None) -> list[AgentTool]:
        """Its tools as the model sees them; `taken`: names other servers' tools already have."""
        taken = set() if taken is None else taken
        out = []
        for t in self.tools:
            hints = t.annotations
            # The server's own word: the user chose to run it (docs/design/agents.md, MCP servers).
            kind = ToolKind.READ if hints is not None and hints.read_only_hint else ToolKind.RUN
            name = unique_name(self.spec.name, t.name, taken)

            async def run(args: dict, _name: str = t.name) -> ToolResult:
                return await self.call(_name, args)

            description, parameters = offered_schema(t.description or "", t.input_schema, name)
            # A server that died is started again at the next call: only one that may not be
            # (MAX_RESTARTS) has its tools answered as unavailable without a call.
            gone = self.problem if self.problem is not None and self._restarts >= MAX_RESTARTS else None
            out.append(AgentTool(Tool(name, description, parameters), kind, run, unavailable=gone))
        return out

    async def _halt(self) -> None:
        """End the task now (and with it the process): no polite wait."""
        self._stop.set()
        if self._task is not None and not self._task.done():
            terminate_groups(self._pids)  # the SDK would wait 2 s for a server that does not answer to end
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._session = None

    async def close(self) -> None:
        self._closed = True
        self._stop.set()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
            except (asyncio.TimeoutError, Exception):
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        self._errlog.close()


async def _call_tool(session: ClientSession, name: str, args: dict):
    """`tools/call`, its result as the server sent it. Not the SDK's call_tool: that checks the
    result's structuredContent against the tool's outputSchema and raises RuntimeError when it is
    missing or does not match, so a tool answering in text only lost its answer, and the server
    was counted lost and started again (each call of a tool with a broken outputSchema did that).
    The structured content is only shown to the model, as text, when there is no other content."""
    from mcp import types

    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=args))
    return await session.send_request(request, types.CallToolResult)


async def _list_tools(session: ClientSession) -> list:
    """Every page of the server's tools (the SDK's list_tools returns one page)."""
    from mcp import types

    listed = await session.list_tools()
    tools, cursor, pages = list(listed.tools), listed.next_cursor, 1
    while cursor and pages < 100:
        listed = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        tools.extend(listed.tools)
        cursor, pages = listed.next_cursor, pages + 1
    return tools


class McpServers:
    """Every configured server of one run (or app)."""

    def __init__(self, specs: Sequence[McpServerSpec]) -> None:
        self.servers = [McpServer(s) for s in specs]

    async def start(self) -> None:
        await asyncio.gather(*(s.start() for s in self.servers))

    def due(self) -> list[McpServer]:
        """The servers given up on whose wait before a new try (`McpServer.retry_wait`) is over."""
        now = time.monotonic()
        return [s for s in self.servers if s.given_up and s.retry_in(now) == 0]

    async def retry(self, servers: Sequence[McpServer]) -> None:
        """Try `servers` (given up on) again, at the same time."""
        await asyncio.gather(*(s.retry() for s in servers))

    @property
    def problems(self) -> dict[str, str]:
        """Server name -> why its tools are unavailable."""
        return {s.spec.name: s.problem for s in self.servers if s.problem is not None}

    def tools(self) -> dict[str, list[AgentTool]]:
        """Server name -> its tools (those of a server that never started: none); no two tools of
        any servers share a name (two servers' names can make one: `a.b` and `a_b`)."""
        taken: set[str] = set()
        return {s.spec.name: s.agent_tools(taken) for s in self.servers}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers))
