"""Provides the reading of an OpenAI chat-completions stream (server-sent events) into typed chunks."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import AsyncGenerator, AsyncIterator

from magnitude_tui.engine.events import ServerTimings
from magnitude_tui.engine.text import encodable_text
from scheduler.types import ToolCallDelta


class MalformedStream(ValueError):
    """The server's stream is not what the OpenAI API promises (what it sent is in the message)."""


class ServerError(RuntimeError):
    """The server reported an error inside the stream (e.g. the context was exceeded)."""

    def __init__(self, message: str, context_exceeded: bool = False) -> None:
        super().__init__(message)
        self.context_exceeded = context_exceeded


def context_exceeded(body: object) -> bool:
    """An error body (its `error` object, or the body itself as vLLM sends it) says the prompt does
    not fit the server's context: llama-server's `type: exceed_context_size_error`, OpenAI's (and
    llama-cpp-python's, and this project's serve) `code: context_length_exceeded`, or OpenAI's and
    vLLM's message "maximum context length"."""
    if not isinstance(body, dict):
        return False
    err = body.get("error", body)
    if not isinstance(err, dict):
        return False
    if err.get("code") == "context_length_exceeded" or err.get("type") == "exceed_context_size_error":
        return True
    return "maximum context length" in str(err.get("message", ""))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens, when sent


@dataclass(frozen=True)
class Chunk:
    """What one `data:` event carried that the client uses (any of it may be absent)."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    timings: ServerTimings | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()  # `delta.tool_calls` pieces, as the server cut them


DONE = object()  # the `data: [DONE]` sentinel


def _is_high_half(text: str) -> bool:
    return bool(text) and "\ud800" <= text[-1] <= "\udbff"


async def events(lines: AsyncIterator[str]) -> AsyncGenerator[Chunk | object, None]:
    """Chunks from the lines of an SSE body, then DONE if the server sent `[DONE]`. Comment
    lines (`: ping`) and other fields are skipped; one event's data may span several lines. A
    character's first UTF-16 half ending an event's text waits for the next event's text, where
    its other half opens (U+FFFD when it does not)."""
    data: list[str] = []
    held = ""

    def whole(chunk: Chunk) -> Chunk:
        nonlocal held
        text, held = held + chunk.text, ""
        if _is_high_half(text) and chunk.finish_reason is None:
            text, held = text[:-1], text[-1]
        text = encodable_text(text)
        return replace(chunk, text=text) if text != chunk.text else chunk

    async for line in lines:
        if line == "":
            if data:
                payload, data = "\n".join(data), []
                if payload.strip() == "[DONE]":
                    if held:
                        yield Chunk(text="\ufffd")
                    yield DONE
                    return
                yield whole(_parse(payload))
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
        elif field not in ("event", "id", "retry"):
            raise MalformedStream(f"not a server-sent event line: {line[:120]!r}")
    if data:  # a last event without its blank line
        payload = "\n".join(data)
        if payload.strip() == "[DONE]":
            if held:
                yield Chunk(text="\ufffd")
            yield DONE
            return
        yield whole(_parse(payload))
    elif held:
        yield Chunk(text="\ufffd")


def parse_chunk(payload: str) -> Chunk:
    """One event's chunk, its text with UTF-16 halves made whole (`encodable_text`)."""
    chunk = _parse(payload)
    text = encodable_text(chunk.text)
    return replace(chunk, text=text) if text != chunk.text else chunk


def _parse(payload: str) -> Chunk:
    """One event's chunk, its text as the JSON gave it (halves included)."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError:
        raise MalformedStream(f"a stream event is not JSON: {payload[:120]!r}") from None
    if not isinstance(body, dict):
        raise MalformedStream(f"a stream event is not a JSON object: {payload[:120]!r}")
    if "error" in body:
        err = body["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        raise ServerError(f"the server reported: {message}", context_exceeded(body))
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise MalformedStream(f"a stream event has no 'choices' list: {payload[:120]!r}")
    try:
        return _chunk(body, choices, payload)
    except MalformedStream:
        raise
    except (AttributeError, TypeError, ValueError) as exc:
        # A field of the wrong type (a choice that is not an object, a null count): the stream is
        # malformed, said as such, never a crash of the client's own code.
        raise MalformedStream(f"a stream event has a field of the wrong type ({exc}): {payload[:120]!r}") from None


def _chunk(body: dict, choices: list, payload: str) -> Chunk:
    text, finish = "", None
    calls: tuple[ToolCallDelta, ...] = ()
    for choice in choices[:1]:  # one completion per request (n=1)
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        if not isinstance(text, str):
            raise MalformedStream(f"'delta.content' is not text: {payload[:120]!r}")
        calls = _tool_calls(delta.get("tool_calls"), payload)
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise MalformedStream(f"'finish_reason' is not text: {payload[:120]!r}")
    return Chunk(text=text, finish_reason=finish, usage=_usage(body.get("usage")),
                 timings=_timings(body.get("timings")), tool_calls=calls)


def _tool_calls(raw, payload: str) -> tuple[ToolCallDelta, ...]:
    """`delta.tool_calls` entries: each has an `index`; a call's first piece (usually) its `id`
    and `function.name`, every piece a fragment of `function.arguments`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise MalformedStream(f"'delta.tool_calls' is not a list: {payload[:120]!r}")
    out = []
    for entry in raw:
        fn = entry.get("function") if isinstance(entry, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        index = entry.get("index") if isinstance(entry, dict) else None
        texts = (fn.get("arguments") or "", fn.get("name") or "", entry.get("id") or "" if isinstance(entry, dict) else "")
        if not isinstance(index, int) or not all(isinstance(t, str) for t in texts):
            raise MalformedStream(f"a 'delta.tool_calls' entry has no integer 'index' or its id, name or "
                                  f"arguments are not text: {payload[:120]!r}")
        call_id, name = entry.get("id") or None, fn.get("name") or None
        out.append(ToolCallDelta(index=index, id=encodable_text(call_id) if call_id else None,
                                 name=encodable_text(name) if name else None, arguments=encodable_text(fn.get("arguments") or "")))
    return tuple(out)


def _usage(raw) -> Usage | None:
    """The server's counts; None (the client estimates them) when absent or not numbers."""
    if not isinstance(raw, dict) or "completion_tokens" not in raw:
        return None
    details = raw.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    try:
        return Usage(int(raw.get("prompt_tokens") or 0), int(raw["completion_tokens"]),
                     int(cached) if cached is not None else None)
    except (TypeError, ValueError):
        return None


def _timings(raw) -> ServerTimings | None:
    """llama-server's own figures; None when absent or not numbers (they are only shown)."""
    if not isinstance(raw, dict) or "predicted_n" not in raw:
        return None
    try:
        return ServerTimings(prompt_n=int(raw.get("prompt_n") or 0), prompt_ms=float(raw.get("prompt_ms") or 0.0),
                             predicted_n=int(raw["predicted_n"]), predicted_ms=float(raw.get("predicted_ms") or 0.0),
                             cache_n=int(raw.get("cache_n") or 0))
    except (TypeError, ValueError):
        return None
