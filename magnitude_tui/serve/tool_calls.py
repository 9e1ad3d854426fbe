"""Provides the checks on a reply's tool calls and their OpenAI shapes (streamed and whole)."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from scheduler.types import Tool, ToolCallDelta


def check_calls(calls: list[dict], tools: tuple[Tool, ...]) -> str | None:
    """Why the model's calls cannot be handed to the caller (None: each names a tool and its
    arguments are a JSON object that validates against that tool's parameters)."""
    by_name = {t.name: t for t in tools}
    for call in calls:
        tool = by_name.get(call["name"])
        if tool is None:
            return f"the model called {call['name'][:64]!r}, which is not among the tools"
        try:
            args = json.loads(call["arguments"] or "{}")
        except ValueError:
            return f"the model's arguments for {tool.name!r} are not JSON"
        if not isinstance(args, dict):
            return f"the model's arguments for {tool.name!r} are not a JSON object"
        errors = sorted(Draft202012Validator(json.loads(tool.parameters)).iter_errors(args), key=str)
        if errors:
            return f"the model's arguments for {tool.name!r} do not match its parameters: {errors[0].message[:200]}"
    return None


def check_reply(text: str, schema: str) -> str | None:
    """Why a finished `response_format` reply fails its schema (None: it parses and validates)."""
    try:
        value = json.loads(text)
    except ValueError:
        return "the reply is not JSON"
    errors = sorted(Draft202012Validator(json.loads(schema)).iter_errors(value), key=str)
    return f"the reply does not match the response schema: {errors[0].message[:200]}" if errors else None


def delta_json(deltas: tuple[ToolCallDelta, ...]) -> list[dict]:
    """`delta.tool_calls` entries: the first piece of a call names it, later ones extend its arguments."""
    out: list[dict] = []
    for d in deltas:
        if d.id is not None:
            out.append({"index": d.index, "id": d.id, "type": "function",
                        "function": {"name": d.name, "arguments": d.arguments}})
        elif out and out[-1]["index"] == d.index:
            out[-1]["function"]["arguments"] += d.arguments
        else:
            out.append({"index": d.index, "function": {"arguments": d.arguments}})
    return out


def message_json(calls: list[dict]) -> list[dict]:
    """`message.tool_calls` of a whole reply."""
    return [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]
