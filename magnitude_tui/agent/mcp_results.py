"""Provides what an MCP server's tools and answers become for the model: names, schemas, result text, what an error was."""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import re

from magnitude_tui.agent.toolbox import ToolResult

_GROUP = getattr(builtins, "BaseExceptionGroup", ())  # Python 3.11+; the SDK backports it on 3.10

# What one call's result may hold (as read_file's cap): 8 MB of text failed every later turn.
MAX_RESULT_CHARS = 64_000
# A tool's parameters schema longer than this is not sent (it is in every prompt).
MAX_SCHEMA_CHARS = 16_000
# The function names a model may be given (OpenAI's rule).
MAX_NAME = 64


def tool_name(server: str, tool: str) -> str:
    """The function name the model sees: server and tool, within OpenAI's name rules."""
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")
    return clean[:MAX_NAME]


def unique_name(server: str, tool: str, taken: set[str]) -> str:
    """tool_name, or when another tool already has it (names differing only in characters the rules
    forbid, or past the 64th): that name ending in a hash of the server and tool names."""
    name = tool_name(server, tool)
    if name in taken:
        tag = hashlib.sha1(f"{server}\0{tool}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}_{tag}"
    taken.add(name)
    return name


def offered_schema(description: str, schema: dict | None, name: str) -> tuple[str, str]:
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


def tool_result(result) -> ToolResult:
    """A CallToolResult as the model reads it: text only, cut at MAX_RESULT_CHARS."""
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


def answered_with_error(e: BaseException) -> bool:
    """Whether `e` is the server's JSON-RPC error answer to a call (not a lost connection or a timeout
    the SDK raises itself, after which the server cannot be trusted to answer)."""
    try:
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
    except ImportError:  # pragma: no cover - mcp 1.x spells it McpError
        from mcp.shared.exceptions import McpError as MCPError  # type: ignore[attr-defined,no-redef]
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT
    return isinstance(e, MCPError) and e.error.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def malformed_answer(e: BaseException) -> bool:
    """Whether `e` is the SDK refusing the shape of an answer the server did send."""
    try:
        from pydantic import ValidationError
    except ImportError:  # pragma: no cover - the SDK is built on pydantic
        return False
    return isinstance(_first_leaf(e), ValidationError)


def first_error(e: BaseException) -> str:
    """What failed, in a line: the first error in `e` (an ExceptionGroup from the SDK's task group included)."""
    e = _first_leaf(e)
    return f"{type(e).__name__}: {e}"[:300]


def _first_leaf(e: BaseException) -> BaseException:
    while _GROUP and isinstance(e, _GROUP) and e.exceptions:
        e = e.exceptions[0]
    return e
