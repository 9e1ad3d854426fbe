"""Provides ChatCall: a chat-completions request body, checked field by field before it reaches the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from magnitude_tui.serve.errors import invalid
from magnitude_tui.serve.tools_body import ToolUse, check_tool_turns, parse_tool_use, tool_calls
from scheduler.types import Message, Priority, SamplingParams

# OpenAI's own roles; "developer" is the newer name for "system". A role reaches the chat template
# only through this table, so text in a role can never become template scaffolding.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_N = 8  # choices per request, each a fork of one evaluated prompt
MAX_STOP = 8
MAX_STOP_CHARS = 256
# Defaults when a body leaves them out: llama-server's sampling defaults.
DEFAULT_TEMPERATURE = 0.8
# Parameters that change what a reply means; silently ignoring them would answer another question.
UNSUPPORTED = ("functions", "function_call", "logit_bias", "audio", "modalities", "prediction")


@dataclass(frozen=True)
class ChatCall:
    """What one POST /v1/chat/completions asks for."""

    messages: tuple[Message, ...]
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    stop: tuple[str, ...] = ()
    priority: int | None = None
    user: str | None = None
    model: str | None = None
    tool_use: ToolUse = ToolUse()

    @property
    def priority_class(self) -> Priority:
        """API requests are agents; one asking for a priority above 0 (lower, as in vLLM) runs
        in the background. No API request can claim the interactive class of a person's turn."""
        return Priority.BACKGROUND if (self.priority or 0) > 0 else Priority.AGENT


def parse_chat(body: object, *, default_max_tokens: int) -> ChatCall:
    """A ChatCall, or OpenAIError (400) naming the first parameter that is wrong."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_json")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, [], {}):
            raise invalid(name, f"'{name}' is not supported by this server (use 'tools')", "unsupported_parameter")
    if body.get("logprobs"):
        raise invalid("logprobs", "'logprobs' is not supported by this server", "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        v = _number(body, name, lo=-2.0, hi=2.0)
        if v not in (None, 0.0):
            raise invalid(name, f"'{name}' other than 0 is not supported by this server", "unsupported_parameter")
    messages = _messages(body.get("messages"))
    tool_use = parse_tool_use(body)
    max_tokens = _integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", lo=1)
    temperature = _number(body, "temperature", lo=0.0, hi=2.0)
    sampling = SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_k=_default(_integer(body, "top_k", lo=0), 40),
        top_p=_default(_number(body, "top_p", lo=0.0, hi=1.0, open_lo=True), 0.95),
        min_p=_default(_number(body, "min_p", lo=0.0, hi=1.0), 0.05),
        seed=_integer(body, "seed"),
        max_tokens=max_tokens or default_max_tokens,
    )
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "'stream_options' must be an object")
    include_usage = _boolean(options, "include_usage", prefix="stream_options.") if options else False
    if options and not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise invalid("user", "'user' must be a string")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "'model' must be a string")
    return ChatCall(messages=messages, sampling=sampling, stream=stream, include_usage=include_usage,
                    n=_default(_integer(body, "n", lo=1, hi=MAX_N), 1), stop=_stops(body.get("stop")),
                    priority=_integer(body, "priority"), user=user or None, model=model, tool_use=tool_use)


def _default(value, fallback):
    return fallback if value is None else value


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


def _stops(raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or len(items) > MAX_STOP or not all(isinstance(s, str) for s in items):
        raise invalid("stop", f"'stop' must be a string or an array of at most {MAX_STOP} strings")
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise invalid("stop", f"each 'stop' string must hold 1 to {MAX_STOP_CHARS} characters")
    return tuple(items)


def _boolean(body: dict, name: str, *, prefix: str = "") -> bool:
    v = body.get(name)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise invalid(prefix + name, f"'{prefix}{name}' must be true or false")
    return v


def _integer(body: dict, name: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(name, f"'{name}' must be an integer (got {type(v).__name__})")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise invalid(name, f"'{name}' must be {_range(lo, hi)} (got {v})")
    return v


def _number(body: dict, name: str, *, lo: float, hi: float, open_lo: bool = False) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise invalid(name, f"'{name}' must be a finite number")
    if v < lo or v > hi or (open_lo and v == lo):
        bound = f"greater than {lo:g}" if open_lo else f"at least {lo:g}"
        raise invalid(name, f"'{name}' must be {bound} and at most {hi:g} (got {v})")
    return float(v)


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f"at least {lo}" if lo is not None else f"at most {hi}"
