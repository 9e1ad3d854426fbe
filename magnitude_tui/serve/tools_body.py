"""Provides the tool-use parts of a chat-completions body: `tools`, `tool_choice`, `response_format`, tool turns."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from magnitude_tui.serve.errors import invalid
from scheduler.types import Message, Tool, ToolCall, ToolChoice, ToolChoiceMode

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function name
MAX_TOOLS = 128
JSON_OBJECT = '{"type": "object"}'


@dataclass(frozen=True)
class ToolUse:
    """What a body asks of tools and the reply's shape."""

    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    response_schema: str | None = None  # JSON schema text the reply must satisfy


def parse_tool_use(body: dict) -> ToolUse:
    """ToolUse, or OpenAIError (400) naming the first parameter that is wrong."""
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls")
    if parallel is None:  # null is the default, as for every other field
        parallel = True
    if not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "'parallel_tool_calls' must be true or false")
    if choice.mode is ToolChoiceMode.FUNCTION:
        parallel = False  # a named function is called exactly once (OpenAI's "forced function")
    # With tools as well, the reply is calls or, when it calls nothing, JSON of the schema.
    return ToolUse(tools, choice, parallel, _response_format(body.get("response_format")))


def _tools(raw: object) -> tuple[Tool, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise invalid("tools", f"'tools' must be an array of at most {MAX_TOOLS} function tools")
    out: list[Tool] = []
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise invalid(where, f"'{where}' must be {{\"type\": \"function\", \"function\": {{...}}}}")
        f = t["function"]
        name = f.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise invalid(f"{where}.function.name", f"'{where}.function.name' must be 1-64 letters, digits, "
                          "'_' or '-'")
        if any(o.name == name for o in out):
            raise invalid(f"{where}.function.name", f"two tools are named {name!r}")
        description = f.get("description", "")
        if not isinstance(description, str):
            raise invalid(f"{where}.function.description", f"'{where}.function.description' must be a string")
        params = f.get("parameters", {"type": "object", "properties": {}})
        schema = check_schema(params, f"{where}.function.parameters")
        kind = params.get("type", "object")
        if kind != "object" and not (isinstance(kind, list) and "object" in kind):
            # A call's arguments are a JSON object; a schema for anything else admits no call.
            raise invalid(f"{where}.function.parameters", f"'{where}.function.parameters' must be a JSON "
                          f"schema of type \"object\" (got {json.dumps(kind)[:40]})")
        out.append(Tool(name, description, schema))
    return tuple(out)


def check_schema(schema: object, where: str) -> str:
    """The schema as JSON text, or a 400 when it is not a JSON schema."""
    if not isinstance(schema, dict):
        raise invalid(where, f"'{where}' must be a JSON schema object")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise invalid(where, f"'{where}' is not a valid JSON schema: {e.message[:200]}") from None
    ref = _outside_ref(schema)
    if ref is not None:
        raise invalid(where, f"'{where}' refers to {ref[:80]!r}, outside the schema; only local '$ref's "
                      "('#/...') are followed")
    return json.dumps(schema)


def _outside_ref(schema: dict) -> str | None:
    """The first `$ref` that points outside the schema (a URL, another file), if any. Only the
    references themselves count: a `$schema` URL or a description quoting a link is no reference
    (the openai client's Pydantic schemas and zod's carry both beside local refs)."""
    stack: list[object] = [schema]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            ref = v.get("$ref")
            if isinstance(ref, str) and not ref.startswith("#"):
                return ref
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _tool_choice(raw: object, tools: tuple[Tool, ...]) -> ToolChoice:
    if raw is None:
        return ToolChoice(ToolChoiceMode.AUTO)
    if not tools:
        raise invalid("tool_choice", "'tool_choice' is only allowed when 'tools' are given")
    if isinstance(raw, str):
        try:
            mode = ToolChoiceMode(raw)
        except ValueError:
            mode = None
        if mode is None or mode is ToolChoiceMode.FUNCTION:
            raise invalid("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        return ToolChoice(mode)
    name = raw.get("function", {}).get("name") if isinstance(raw, dict) and isinstance(raw.get("function"), dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(name, str):
        raise invalid("tool_choice", "'tool_choice' must name a function: {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}")
    if not any(t.name == name for t in tools):
        raise invalid("tool_choice", f"'tool_choice' names {name[:64]!r}, which is not among 'tools'")
    return ToolChoice(ToolChoiceMode.FUNCTION, name)


def _response_format(raw: object) -> str | None:
    if raw is None:
        return None
    fields = raw if isinstance(raw, dict) else {}
    kind = fields.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        spec = fields.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
            raise invalid("response_format", "'response_format.json_schema' must be an object with a "
                          "'name' and a 'schema'")
        return check_schema(spec.get("schema", {"type": "object"}), "response_format.json_schema.schema")
    raise invalid("response_format", "'response_format.type' must be \"text\", \"json_object\" or "
                  "\"json_schema\"")


def tool_calls(raw: object, where: str) -> tuple[ToolCall, ...]:
    """An assistant turn's `tool_calls`, as the caller replays them. Their `arguments` may be any
    string, as OpenAI takes them: a reply cut by max_tokens inside a call hands the caller arguments
    that are not JSON, and clients (the Agents SDK) replay that turn as it came. The template
    renders such text as it is (backend/chat.py)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid(where, f"'{where}' must be an array of tool calls")
    out = []
    for j, c in enumerate(raw):
        at = f"{where}[{j}]"
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or not isinstance(c.get("id"), str) or not isinstance(f, dict) \
                or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments", ""), str):
            raise invalid(at, f"'{at}' must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                          "{\"name\": ..., \"arguments\": \"<JSON text>\"}}")
        out.append(ToolCall(c["id"], f["name"], f.get("arguments") or "{}"))
    return tuple(out)


def check_tool_turns(messages: tuple[Message, ...]) -> None:
    """Every tool turn answers a call an earlier assistant turn made."""
    called: set[str] = set()
    for i, m in enumerate(messages):
        called.update(c.id for c in m.tool_calls)
        if m.role == "tool":
            if m.tool_call_id is None:
                raise invalid(f"messages[{i}].tool_call_id", f"'messages[{i}]' is a tool message without "
                              "'tool_call_id'")
            if m.tool_call_id not in called:
                raise invalid(f"messages[{i}].tool_call_id", f"'messages[{i}].tool_call_id' "
                              f"({m.tool_call_id[:64]!r}) answers no earlier assistant tool call")
