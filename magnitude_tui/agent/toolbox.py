"""Provides AgentTool (a tool's schema, kind and code) and ToolResult, the seam between the loop and every tool."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
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


# Lone surrogates: what Python makes of bytes that are not UTF-8 in a file name (os.listdir's
# surrogateescape), and what a JSON "\ud800" escape (an MCP server's result) decodes to. No text
# holding one can be encoded: the engine could not tokenize the prompt, a terminal not print it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def sendable(result: ToolResult) -> ToolResult:
    """`result` with every lone surrogate shown as U+FFFD (what a UTF-8 decoder shows for a byte
    it cannot read), so the model, the transcript and the JSON all get text that encodes."""
    if not (_SURROGATE.search(result.text) or (result.diff and _SURROGATE.search(result.diff))):
        return result
    return replace(result, text=_SURROGATE.sub("\ufffd", result.text),
                   diff=None if result.diff is None else _SURROGATE.sub("\ufffd", result.diff))


# A tool's code: the call's parsed arguments in, its result out (awaited; cancellable).
ToolCode = Callable[[dict], Awaitable[ToolResult]]
# What the user sees before approving (an edit's diff), or a refusal decided without asking.
ToolPreview = Callable[[dict], "str | ToolResult | None"]
# Why a call must be asked about even when its tool is allowed for the pane (None: it need not be).
ToolCaution = Callable[[dict], "str | None"]


@dataclass(frozen=True)
class AgentTool:
    tool: Tool  # the OpenAI function schema the model sees
    kind: ToolKind
    run: ToolCode
    preview: ToolPreview | None = None
    # Why it cannot be used now (an MCP server that died); the loop answers that instead of running it.
    unavailable: str | None = None
    caution: ToolCaution | None = None

    @property
    def name(self) -> str:
        return self.tool.name


def function_tool(name: str, description: str, properties: dict, required: list[str]) -> Tool:
    """A scheduler Tool from a JSON-schema object's properties (no extra keys allowed)."""
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return Tool(name, description, json.dumps(schema))
