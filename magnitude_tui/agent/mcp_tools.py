"""Provides McpServers: stdio MCP servers from agents.toml (official `mcp` SDK), their tools as AgentTools; a failing server or tool fails alone."""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import functools
import hashlib
import json
import logging
import os
import re
import signal
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
# A call that outlives timeout_s: the server is asked for a ping this long; one that answers is
# still up (only that call failed), one that does not is stopped and started again at the next call.
PING_WAIT_S = 5.0
# A server that died (or stopped answering) is started again at its next call, up to this many
# times in a row without a call answered in between; then its tools stay unavailable.
MAX_RESTARTS = 3
# What one call's result may hold (as read_file's cap): 8 MB of text failed every later turn.
MAX_RESULT_CHARS = 64_000
# A tool's parameters schema longer than this is not sent (it is in every prompt).
MAX_SCHEMA_CHARS = 16_000
# After a server ends, what is left of its process group gets this long after SIGTERM, then SIGKILL.
GROUP_TERM_WAIT_S = 1.0
# The function names a model may be given (OpenAI's rule).
MAX_NAME = 64


def tool_name(server: str, tool: str) -> str:
    """The function name the model sees: server and tool, within OpenAI's name rules."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")
    return clean[:MAX_NAME]


def _unique_name(server: str, tool: str, taken: set[str]) -> str:
    """tool_name, or when another tool already has it (names differing only in characters the rules
    forbid, or past the 64th): that name ending in a hash of the server and tool names."""
    name = tool_name(server, tool)
    if name in taken:
        tag = hashlib.sha1(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}_{tag}"
    taken.add(name)
    return name


# ---- the server's process group ---------------------------------------------------------------

# The pid of the process the SDK starts, for the task that starts it (the SDK does not say it). The
# SDK starts each server in its own session (process group = its pid) but kills that group only
# when the server itself does not end: a server that ends at once on EOF left its own children running.
_SPAWNED: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("mcp_spawned", default=None)


def _hook_spawn() -> None:
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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _end_group(pgid: int) -> None:
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
        self._not_jsonrpc: str | None = None  # the first stdout line that was not JSON-RPC
        self._started = False  # it once listed its tools (then it may be started again)
        self._restarts = 0  # in a row, without a call answered in between
        self._restart_lock = asyncio.Lock()
        self._pids: list[int] = []  # the process the SDK started (its group's id)
        self._closed = False  # closed for good: never started again

    async def start(self) -> None:
        """Start the server and list its tools, or set `problem`; never raises."""
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
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
        if self.problem is None:
            self._started = True

    async def _serve(self) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import get_default_environment, stdio_client

        _hook_spawn()
        spawned: list[int] = []
        _SPAWNED.set(spawned)
        self._pids = spawned
        # A byte that is not UTF-8 in the server's output is shown as U+FFFD ("strict" ended the
        # SDK's reader: the call then hung until timeout_s and the server was lost).
        params = StdioServerParameters(command=self.spec.command, args=list(self.spec.args),
                                       env={**get_default_environment(), **dict(self.spec.env)},
                                       encoding_error_handler="replace")
        try:
            async with stdio_client(params, errlog=self._errlog) as (read, write):
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    await session.initialize()
                    self.tools, self._session = await _list_tools(session), session
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
            for pid in spawned:  # its children: what it started and left behind when it ended
                await _end_group(pid)

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
            size = self._errlog.seek(0, 2)
            # Only the tail is read: a server's 5 MB banner is not read back whole.
            self._errlog.seek(max(since, size - 4000))
            tail = self._errlog.read()[-400:].strip()
        except (OSError, ValueError):
            return ""
        return f" (stderr: {tail})" if tail else ""

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
                # call failed, its other tools go on.
                return ToolResult.failed(f"{late}; the call was given up (the server still answers)"
                                         f"{self._stderr_tail(since)}")
            self._fail(f"{late}, and then not a ping either", since)
            await self._halt()
            return self._lost()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if _answered_with_error(e) and self._session is not None:
                # The server answered this call with a JSON-RPC error (bad params, a tool that threw in
                # another SDK): the call failed, the server is still there for the others.
                return ToolResult.failed(f"{name} failed: {_first_error(e)}")
            if _malformed_answer(e) and self._session is not None:
                # It answered, in a shape the MCP schema does not allow: that answer is lost, not
                # the server (starting it again lost its state: a browser's pages, a login).
                return ToolResult.failed(f"{name}: the server's answer does not follow the MCP schema: "
                                         f"{_first_error(e)}")
            self._fail(f"{name} failed: {_first_error(e)}", since)
            return self._lost()
        self._restarts = 0
        return _result(result)

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
            return _answered_with_error(e)  # an error answer is an answer (a server without ping)
        return True

    def agent_tools(self, taken: set[str] | None = None) -> list[AgentTool]:
        """Its tools as the model sees them; `taken`: names other servers' tools already have."""
        taken = set() if taken is None else taken
        out = []
        for t in self.tools:
            hints = t.annotations
            # The server's own word: the user chose to run it (docs/design/agents.md, MCP servers).
            kind = ToolKind.READ if hints is not None and hints.read_only_hint else ToolKind.RUN
            name = _unique_name(self.spec.name, t.name, taken)

            async def run(args: dict, _name: str = t.name) -> ToolResult:
                return await self.call(_name, args)

            description, parameters = _offered_schema(t.description or "", t.input_schema, name)
            # A server that died is started again at the next call: only one that may not be
            # (MAX_RESTARTS) has its tools answered as unavailable without a call.
            gone = self.problem if self.problem is not None and self._restarts >= MAX_RESTARTS else None
            out.append(AgentTool(Tool(name, description, parameters), kind, run, unavailable=gone))
        return out

    async def _halt(self) -> None:
        """End the task now (and with it the process): no polite wait."""
        self._stop.set()
        if self._task is not None and not self._task.done():
            for pid in self._pids:  # the SDK would wait 2 s for a server that does not answer to end
                try:
                    os.killpg(pid, signal.SIGTERM)
                except (OSError, AttributeError):
                    pass
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


def _offered_schema(description: str, schema: dict | None, name: str) -> tuple[str, str]:
    """The description and parameters the model is given. The engine turns every tool's schema into
    one grammar per request, so one schema it cannot convert (a 'pattern' without ^...$, a $ref to
    nowhere or to another file) failed every turn of every agent offered the tool, called or not; and
    a huge one filled every prompt. Such a tool is offered as taking any object, its schema (when
    not too long) in its description, and the server judges the arguments."""
    text = json.dumps(schema if schema is not None else {"type": "object"}, ensure_ascii=False)
    why = _schema_problem(text, name)
    if why is None:
        return description, text
    if len(text) <= MAX_SCHEMA_CHARS:
        shown = f"\n(Its parameters, as JSON schema, not checked before the call: {text})"
    else:
        shown = (f"\n(Its parameters schema, {len(text):,} characters, is not shown: it is too long; "
                 "ask with the arguments you know, the server says what is wrong.)")
    return description + shown, json.dumps({"type": "object"})


@functools.lru_cache(maxsize=1024)  # the TUI asks again at every agent's start
def _schema_problem(text: str, name: str) -> str | None:
    """Why `text` cannot be a tool's parameters as is (None: it can)."""
    if len(text) > MAX_SCHEMA_CHARS:
        return f"it is {len(text):,} characters"
    schema = json.loads(text)
    if not isinstance(schema, dict):
        return "it is not a JSON object"
    try:
        from jsonschema import Draft202012Validator

        Draft202012Validator.check_schema(schema)
    except Exception as e:
        return f"it is not a valid JSON schema ({type(e).__name__})"
    try:
        from backend.grammar import schema_grammar
    except ImportError:  # pragma: no cover - no grammar converter: the engine has none either
        return None
    try:
        schema_grammar(text, name)
    except Exception as e:  # GrammarError, and what else a converter raises
        return str(e)
    return None


def _result(result) -> ToolResult:
    parts = []
    for c in getattr(result, "content", None) or []:
        text = getattr(c, "text", None)
        resource = getattr(c, "resource", None)  # an embedded resource: its text when it has one
        resource_text = getattr(resource, "text", None)
        if not isinstance(text, str) and isinstance(resource_text, str):
            text = f"[resource {getattr(resource, 'uri', '')}]\n{resource_text}"
        if not isinstance(text, str) and getattr(c, "type", None) == "resource_link":
            text = f"[resource link: {getattr(c, 'uri', '')}]"
        if not isinstance(text, str):  # an image, audio, a binary resource: the model reads text only
            mime = getattr(c, "mime_type", None) or getattr(resource, "mime_type", None)
            text = f"[{getattr(c, 'type', 'content')}{f' ({mime})' if mime else ''} not shown]"
        parts.append(text)
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if not text and getattr(result, "is_error", False):
        text = "the tool reported an error and said nothing more"
    if len(text) > MAX_RESULT_CHARS:
        text = (text[:MAX_RESULT_CHARS] + f"\n[{len(text) - MAX_RESULT_CHARS:,} of {len(text):,} characters cut: "
                f"an MCP tool's result is shown up to {MAX_RESULT_CHARS:,}]")
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


def _malformed_answer(e: BaseException) -> bool:
    """Whether `e` is the SDK refusing the shape of an answer the server did send."""
    while _GROUP and isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - the SDK is built on pydantic
        return False
    return isinstance(e, ValidationError)


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
        """Server name -> its tools (those of a server that never started: none); no two tools of
        any servers share a name (two servers' names can make one: `a.b` and `a_b`)."""
        taken: set[str] = set()
        return {s.spec.name: s.agent_tools(taken) for s in self.servers}

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers))
