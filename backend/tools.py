"""Provides tool-call syntaxes: which one a chat template speaks, the generic format, and the stream parser."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from scheduler.types import Message, Tool, ToolCallDelta


class ToolSyntax(str, Enum):
    """How a model writes a tool call, read off its chat template."""

    HERMES = "hermes"  # <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Hermes, Qwen 2.5+)
    LLAMA3 = "llama3"  # the reply is {"name": ..., "parameters": {...}} (Llama 3.1+ JSON form)
    GENERIC = "generic"  # no tool support in the template: tools in the system turn, calls as Hermes

    @property
    def open(self) -> str | None:
        return None if self is ToolSyntax.LLAMA3 else "<tool_call>"

    @property
    def close(self) -> str | None:
        return None if self is ToolSyntax.LLAMA3 else "</tool_call>"

    @property
    def args_key(self) -> str:
        return "parameters" if self is ToolSyntax.LLAMA3 else "arguments"

    @property
    def template_renders_tools(self) -> bool:
        return self is not ToolSyntax.GENERIC


def detect_syntax(template: str) -> ToolSyntax:
    """The tool-call form a Jinja chat template teaches its model; GENERIC when it knows no tools."""
    if "tools" not in template:
        return ToolSyntax.GENERIC
    if "<tool_call>" in template:
        return ToolSyntax.HERMES
    if "<|python_tag|>" in template or ("ipython" in template and '"parameters"' in template):
        return ToolSyntax.LLAMA3
    return ToolSyntax.GENERIC


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_json(tool: Tool) -> dict:
    """A tool in OpenAI's request shape, which chat templates iterate over."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": json.loads(tool.parameters)}}


GENERIC_SYSTEM = (
    "You can call these tools (JSON schemas):\n{tools}\n\n"
    "To call a tool, reply with exactly:\n<tool_call>\n{{\"name\": \"<tool name>\", \"arguments\": "
    "{{<arguments as JSON>}}\n</tool_call>\nA tool's answer comes back in <tool_response> tags."
)


def generic_messages(messages: Sequence[Message], tools: Sequence[Tool]) -> list[Message]:
    """The conversation in the generic format, for a template with no tool support: the tool list
    joins the first system turn, an assistant turn's calls become Hermes-style text, and a tool
    result becomes a user turn in <tool_response> tags. Roles stay the template's standard ones.
    Consecutive results (a turn's parallel calls) share one user turn, as Hermes and Qwen templates
    write them: one turn's markers fewer per extra result, and the turns keep alternating."""
    out: list[Message] = []
    if tools:
        listing = "\n".join(json.dumps(tool_json(t)["function"], ensure_ascii=False) for t in tools)
        head = GENERIC_SYSTEM.format(tools=listing)
        if messages and messages[0].role == "system":
            out.append(Message("system", f"{messages[0].content}\n\n{head}"))
            messages = messages[1:]
        else:
            out.append(Message("system", head))
    previous = None
    for m in messages:
        if m.role == "tool":
            wrapped = f"<tool_response>\n{m.content}\n</tool_response>"
            if previous == "tool":
                out[-1] = Message("user", f"{out[-1].content}\n{wrapped}")
            else:
                out.append(Message("user", wrapped))
        elif m.role == "assistant" and m.tool_calls:
            calls = "\n".join(call_text(ToolSyntax.GENERIC, c.name, c.arguments) for c in m.tool_calls)
            out.append(Message("assistant", f"{m.content}\n{calls}".strip()))
        else:
            out.append(Message(m.role, m.content))
        previous = m.role
    return out


def call_text(syntax: ToolSyntax, name: str, arguments: str) -> str:
    """A call written the way `syntax` writes it (the generic format's history, tests' scripts)."""
    body = f'{{"name": {json.dumps(name)}, "{syntax.args_key}": {arguments or "{}"}}}'
    return f"{syntax.open}\n{body}\n{syntax.close}" if syntax.open else body


_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(arguments|parameters)"\s*:\s*')


class _Phase(Enum):
    TEXT = "text"
    HEAD = "head"  # inside a call, before its arguments start
    ARGS = "args"  # streaming the arguments' JSON value
    TAIL = "tail"  # arguments done, waiting for the call's end


@dataclass
class _Call:
    index: int
    id: str
    name: str | None = None
    body: str = ""  # the call's JSON text so far (HEAD) or what follows the arguments (TAIL)
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    args_started: bool = False
    scalar: bool = False


class ToolCallParser:
    """Splits a streaming reply into its text and its tool calls, one piece at a time.

    Text before a call streams as content. A call's id and name are sent as soon as its head
    (`{"name": "...", "arguments":`) has arrived, its arguments in fragments as they stream (a
    string-aware brace count tells where the value ends). A call whose keys come in another order
    is sent whole when it closes. `opened` says when a call has begun (the engine then constrains
    the rest of it); `finish()` returns whatever was held back.
    """

    def __init__(self, syntax: ToolSyntax) -> None:
        self.syntax = syntax
        self.phase = _Phase.TEXT
        self.calls: list[_Call] = []
        self._held = ""  # text that may be the start of the open marker
        self._seen_text = False  # LLAMA3: a call must be the first thing in the reply
        self.opened = 0  # calls begun so far
        self._text_out: list[str] = []
        self._again = ""  # text after a call's end, still to read in this feed
        self._gap = ""  # whitespace after a call, held until text follows
        self._just_called = False  # a call ended and no text has followed it yet

    @property
    def in_call(self) -> bool:
        return self.phase is not _Phase.TEXT

    def pending_call_text(self) -> str:
        """What the open call holds so far (before its head is complete)."""
        return self.calls[-1].body if self.in_call and self.phase is _Phase.HEAD else ""

    def feed(self, piece: str) -> tuple[str, list[ToolCallDelta]]:
        text: list[str] = []
        self._text_out = text
        deltas: list[ToolCallDelta] = []
        data = self._held + piece
        self._held = ""
        i = 0
        while i < len(data) or self._again:
            if i >= len(data):  # a call ended: what followed it in the same piece is read next
                data, i, self._again = self._again, 0, ""
                continue
            if self.phase is _Phase.TEXT:
                i = self._text(data, i, text)
            elif self.phase is _Phase.HEAD:
                i = self._head(data, i, deltas)
            elif self.phase is _Phase.ARGS:
                i = self._args(data, i, deltas)
            else:
                i = self._tail(data, i, deltas)
        return "".join(text), deltas

    def finish(self) -> str:
        """The reply ended: text held back is text after all; an unfinished call is returned as
        its raw text (it never closed, so it is not a call). After whole calls, though, the start
        of one more call (its marker, or a head cut before the name) is dropped: the reply is the
        calls (a small model may go on opening calls until the token limit), not their scaffolding."""
        held, self._held = self._held, ""
        if self.phase is _Phase.TEXT:
            return held if held.strip() and not self._just_called else ""
        call = self.calls[-1]
        self.phase = _Phase.TEXT
        if call.name is None:
            self.calls.pop()
            self.opened -= 1
            return "" if self.calls else (self.syntax.open or "") + call.body + held
        return held

    # ---- states ----------------------------------------------------------------------------

    def _start_call(self) -> None:
        self._gap = ""
        self.calls.append(_Call(index=len(self.calls), id=new_call_id()))
        self.phase = _Phase.HEAD
        self.opened += 1

    def _text(self, data: str, i: int, text: list[str]) -> int:
        marker = self.syntax.open
        if marker is None:  # LLAMA3: the reply itself is the call when it starts with '{'
            rest = data[i:]
            if not self._seen_text and rest.lstrip().startswith("{"):
                self._start_call()
                return i + (len(rest) - len(rest.lstrip()))
            if not self._seen_text and not rest.strip():
                self._held = rest
                return len(data)
            self._seen_text = True
            text.append(rest)
            return len(data)
        j = data.find(marker, i)
        if j >= 0:
            self._say(data[i:j], text)
            self._start_call()
            return j + len(marker)
        # Hold back a tail that could be the marker's beginning.
        for k in range(min(len(marker) - 1, len(data) - i), 0, -1):
            if marker.startswith(data[len(data) - k:]):
                self._say(data[i:len(data) - k], text)
                self._held = data[len(data) - k:]
                return len(data)
        self._say(data[i:], text)
        return len(data)

    def _say(self, piece: str, text: list[str]) -> None:
        """Text for the caller; whitespace between or after calls is layout, not content, and is
        sent only when more text follows it."""
        if self.calls and not piece.strip():
            self._gap += piece
            return
        if piece:
            text.append(self._gap + piece)
            self._gap = ""
            self._just_called = False

    def _head(self, data: str, i: int, deltas: list[ToolCallDelta]) -> int:
        call = self.calls[-1]
        call.body += data[i:]
        m = _HEAD.match(call.body)
        if m:
            call.name = json.loads(f'"{m.group(1)}"')
            deltas.append(ToolCallDelta(call.index, id=call.id, name=call.name))
            rest = call.body[m.end():]
            call.body = ""
            self.phase = _Phase.ARGS
            self._again = rest + self._again
            return len(data)
        return self._whole_call_if_closed(call, deltas, len(data))

    def _whole_call_if_closed(self, call: _Call, deltas: list[ToolCallDelta], end: int) -> int:
        """Keys in another order: wait for the call's end, then send it whole."""
        body = call.body
        close = self.syntax.close
        obj_text: str | None
        if close is not None:
            j = body.find(close)
            if j < 0:
                return end
            obj_text, after = body[:j], body[j + len(close):]
        else:
            obj_text, after = _split_json_object(body)
            if obj_text is None:
                return end
        try:
            obj = json.loads(obj_text)
            name = obj["name"]
            args = obj.get(self.syntax.args_key, obj.get("arguments", obj.get("parameters", {})))
        except (ValueError, KeyError, TypeError, AttributeError):
            obj = None
        if obj is None or not isinstance(name, str):
            # Not a call after all: it goes out as text the caller can read.
            self.calls.pop()
            self.opened -= 1
            self.phase = _Phase.TEXT
            self._again = after
            self._text_out.append((self.syntax.open or "") + obj_text + (close or ""))
            return end
        call.name = name
        deltas.append(ToolCallDelta(call.index, id=call.id, name=name,
                                    arguments=args if isinstance(args, str) else json.dumps(args)))
        call.body = ""
        self.phase = _Phase.TEXT
        self._just_called = True
        self._again = after
        return end

    def _args(self, data: str, i: int, deltas: list[ToolCallDelta]) -> int:
        call = self.calls[-1]
        start, done = i, False
        while i < len(data) and not done:
            ch = data[i]
            if not call.args_started:
                if ch.isspace():
                    i += 1
                    start = i
                    continue
                call.args_started = True
            if call.in_string:
                i += 1
                if call.escaped:
                    call.escaped = False
                elif ch == "\\":
                    call.escaped = True
                elif ch == '"':
                    call.in_string = False
                    done = call.depth == 0
                continue
            if call.depth == 0 and call.scalar and ch in ",}":
                done = True  # a bare scalar ended at this character, which is not part of it
                break
            i += 1
            if ch == '"':
                call.in_string = True
            elif ch in "{[":
                call.depth += 1
            elif ch in "}]":
                call.depth -= 1
                done = call.depth == 0
            elif call.depth == 0:
                call.scalar = True
        if data[start:i]:
            deltas.append(ToolCallDelta(call.index, arguments=data[start:i]))
        if done:
            self.phase = _Phase.TAIL
        return i

    def _tail(self, data: str, i: int, deltas: list[ToolCallDelta]) -> int:
        call = self.calls[-1]
        call.body += data[i:]
        close = self.syntax.close
        if close is None:
            j = call.body.find("}")
            if j < 0:
                return len(data)
            after = call.body[j + 1:]
        else:
            j = call.body.find(close)
            if j < 0:
                return len(data)
            after = call.body[j + len(close):]
        call.body = ""
        self.phase = _Phase.TEXT
        self._just_called = True
        self._again = after
        return len(data)


def _split_json_object(text: str) -> tuple[str | None, str]:
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[:i + 1], text[i + 1:]
    return None, text
