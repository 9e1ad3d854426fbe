"""Provides AgentTool (a tool's schema, kind and code) and ToolResult, the seam between the loop and every tool."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Awaitable, Callable

from magnitude_tui.agent.policy import ToolKind
from scheduler.types import Tool


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model as the tool message. `ok` False: a refusal or a failure, which
    the model reads and may act on; tools never raise into the loop."""

    text: str
    ok: bool = True
    diff: str | None = None  # an edit's or write's change, for the transcript

    @classmethod
    def refused(cls, why: str) -> "ToolResult":
        return cls(f"refused: {why}", ok=False)

    @classmethod
    def failed(cls, why: str) -> "ToolResult":
        return cls(f"error: {why}", ok=False)


# A tool's code: the call's parsed arguments in, its result out (awaited; cancellable).
ToolCode = Callable[[dict], Awaitable[ToolResult]]
# What the user sees before approving (an edit's diff), or a refusal decided without asking.
ToolPreview = Callable[[dict], "str | ToolResult | None"]


@dataclass(frozen=True)
class AgentTool:
    tool: Tool  # the OpenAI function schema the model sees
    kind: ToolKind
    run: ToolCode
    preview: ToolPreview | None = None
    # Why it cannot be used now (an MCP server that died); the loop answers that instead of running it.
    unavailable: str | None = None

    @property
    def name(self) -> str:
        return self.tool.name


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> Tool:
    """A scheduler Tool from a JSON-schema object's properties (no extra keys allowed)."""
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Tool(name, description, json.dumps(schema))
