"""Provides ChatCall: a chat-completions request body, checked field by field before it reaches the engine."""

from __future__ import annotations

from dataclasses import dataclass

from magnitude_tui.serve.errors import invalid
from magnitude_tui.serve.fields import CallFields, integer, parse_call, refuse_penalties
from magnitude_tui.serve.tools_body import ToolUse, check_tool_turns, parse_tool_use, tool_calls
from scheduler.types import Message

# OpenAI's own roles; "developer" is the newer name for "system". A role reaches the chat template
# only through this table, so text in a role can never become template scaffolding.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# Parameters that change what a reply means; silently ignoring them would answer another question.
UNSUPPORTED = ("functions", "function_call", "logit_bias", "audio", "modalities", "prediction")


@dataclass(frozen=True, kw_only=True)
class ChatCall(CallFields):
    """What one POST /v1/chat/completions asks for: the shared fields (fields.py), the messages
    and what it asks of tools."""

    messages: tuple[Message, ...]
    tool_use: ToolUse = ToolUse()


def parse_chat(body: object, *, default_max_tokens: int) -> ChatCall:
    """A ChatCall, or OpenAIError (400) naming the first parameter that is wrong."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_json")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, [], {}):
            raise invalid(name, f"'{name}' is not supported by this server (use 'tools')", "unsupported_parameter")
    if body.get("logprobs"):
        raise invalid("logprobs", "'logprobs' is not supported by this server", "unsupported_parameter")
    refuse_penalties(body)
    messages = _messages(body.get("messages"))
    tool_use = parse_tool_use(body)
    max_tokens = integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", lo=1)
    return parse_call(body, ChatCall, max_tokens=max_tokens or default_max_tokens, messages=messages,
                      tool_use=tool_use)


def _messages(raw: object) -> tuple[Message, ...]:
    if not isinstance(raw, list) or not raw:
        raise invalid("messages", "'messages' must be a non-empty array of {role, content} objects")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, f"'{where}' must be an object with 'role' and 'content'")
        role = m.get("role")
        if role not in ROLES:
            raise invalid(f"{where}.role", f"'{where}.role' must be one of {', '.join(sorted(ROLES))} "
                          f"(got {str(role)[:40]!r})")
        calls = tool_calls(m.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
        call_id = m.get("tool_call_id") if role == "tool" else None
        if call_id is not None and not isinstance(call_id, str):
            raise invalid(f"{where}.tool_call_id", f"'{where}.tool_call_id' must be a string")
        name = m.get("name") if role == "tool" and isinstance(m.get("name"), str) else None
        out.append(Message(ROLES[role], _content(m.get("content"), f"{where}.content"), tool_calls=calls,
                           tool_call_id=call_id, name=name))
    if not any(m.content.strip() or m.tool_calls for m in out):
        raise invalid("messages", "every message is empty: send some text")
    check_tool_turns(tuple(out))
    return tuple(out)


def _content(raw: object, where: str) -> str:
    if isinstance(raw, str):
        return raw
    if raw is None:
        return ""
    if isinstance(raw, list):
        parts = []
        for j, part in enumerate(raw):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{where}[{j}]", f"'{where}[{j}]' must be a text part "
                              "({\"type\": \"text\", \"text\": ...}); images and audio are not supported")
            parts.append(part["text"])
        return "".join(parts)
    raise invalid(where, f"'{where}' must be a string or an array of text parts")
