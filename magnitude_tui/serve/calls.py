"""Provides what every HTTP route shares: the server's options, how a call ended, who called,
the key check, a bounded JSON body, the queue's room, and the answer: a whole reply or its SSE
chunks (chat and text completions differ only in their shapes)."""

from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import AsyncIterator, Callable, Iterable, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from magnitude_tui.serve.completion import Choice, Completion, Delta, refusal
from magnitude_tui.serve.errors import ErrorType, OpenAIError, invalid
from magnitude_tui.serve.guard import GuardPolicy
from magnitude_tui.serve.hub import EngineHub, EngineState
from scheduler.types import ErrorKind

MAX_BODY_BYTES = 4 * 2**20
BODY_TIMEOUT_S = 30.0
MAX_JSON_DEPTH = 64  # tool schemas nest a dozen levels; thousands only exhaust a parser's stack


@dataclass(frozen=True)
class ServeOptions:
    model_name: str = "default"
    api_key: str | None = None
    max_live: int = 64  # requests in the engine at once; more get 429
    max_body_bytes: int = MAX_BODY_BYTES
    default_max_tokens: int | None = None  # None: what the sequence's context leaves
    guard: GuardPolicy | None = None  # Host/Origin/Content-Type checks (serve_async: the bound names)


class Outcome(str, Enum):
    """How one HTTP call ended, for the per-call log line."""

    OK = "ok"
    ERROR = "error"  # a choice failed while generating
    CANCELLED = "cancelled"  # the client hung up


def address(request: Request) -> str:
    return f"api@{request.client.host}" if request.client else "api"


def not_ready(hub: EngineHub) -> OpenAIError:
    # Never the engine's own words (a pid, a log path): /health answers without a key.
    if hub.draining:
        return OpenAIError(503, "the server is shutting down", ErrorType.UNAVAILABLE, "shutting_down")
    if hub.state is EngineState.FAILED:
        if hub.supervised:
            return OpenAIError(503, "the engine stopped and is being restarted; retry shortly",
                               ErrorType.UNAVAILABLE, "engine_failed", retry_after_s=2)
        return OpenAIError(503, "the engine stopped", ErrorType.UNAVAILABLE, "engine_failed")
    return OpenAIError(503, f"the model is loading ({hub.load_fraction:.0%}); retry shortly",
                       ErrorType.UNAVAILABLE, "model_loading", retry_after_s=2)


def authorize(request: Request, options: ServeOptions) -> None:
    if options.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), options.api_key):
        raise OpenAIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                          ErrorType.AUTHENTICATION, "invalid_api_key")


async def take_body(request: Request, hub: EngineHub, options: ServeOptions) -> object:
    """A completion call's JSON body, once the caller's key is good and the engine takes calls."""
    authorize(request, options)
    body = await read_json(request, options.max_body_bytes)
    if hub.state is not EngineState.READY or hub.draining:
        raise not_ready(hub)
    return body


def check_room(hub: EngineHub, options: ServeOptions, n: int) -> None:
    """429 when `n` more choices would put more requests in the engine than the server allows
    now; 400 naming `n` when they alone are more than it ever allows (no retry could succeed)."""
    if n > options.max_live:
        raise invalid("n", f"'n' is {n}, more choices than this server runs at once (its limit is "
                      f"{options.max_live} requests in flight, set by --max-queue)")
    if hub.num_live + n > options.max_live:
        raise OpenAIError(429, f"too many requests in flight ({hub.num_live} of {options.max_live}); "
                          "retry shortly", ErrorType.RATE_LIMIT, "queue_full", retry_after_s=1)


async def read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise OpenAIError(413, f"the request body is over {limit:,} bytes", ErrorType.INVALID_REQUEST,
                          "body_too_large")
    data = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            data.extend(chunk)
            if len(data) > limit:
                raise OpenAIError(413, f"the request body is over {limit:,} bytes", ErrorType.INVALID_REQUEST,
                                  "body_too_large")

    try:
        # A body sent a byte at a time would otherwise hold its connection (and a slot) for ever.
        await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise OpenAIError(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s",
                          ErrorType.INVALID_REQUEST, "request_timeout") from None
    too_deep = invalid(None, f"the request body nests deeper than {MAX_JSON_DEPTH} levels", "invalid_json")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(None, f"the request body is not valid JSON: {e}", "invalid_json") from None
    except RecursionError:  # past the parser's own limit (about 1,000 levels)
        raise too_deep from None
    problem = body_problem(body, MAX_JSON_DEPTH)
    if problem == "depth":
        raise too_deep
    if problem is not None:
        # JSON's \ud800 escapes decode to lone surrogates, which no UTF-8 text holds: a tokenizer,
        # a log line or a digest of the `user` field would fail on them later (a 500).
        raise invalid(None, f"the request body holds a lone UTF-16 surrogate ({problem}), which is not "
                      "Unicode text", "invalid_json")
    return body


def body_problem(value: object, limit: int) -> str | None:
    """None when `value` is fit to be read further, else what is wrong: "depth" when an object or
    array lies more than `limit` levels deep, or the escape of a lone surrogate in a string or key.
    Walked without recursion, so a hostile body cannot exhaust the stack of whatever reads it next."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"\\u{ord(v[e.start]):04x}"
        elif isinstance(v, (dict, list)):
            if depth > limit:
                return "depth"
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
            if isinstance(v, dict):
                stack.extend((k, depth) for k in v)
    return None


def generation_failed(message: str | None) -> OpenAIError:
    """A choice that failed after its call was taken (the prompt was accepted)."""
    return OpenAIError(500, message or "generation failed", ErrorType.SERVER, "generation_failed")


def choice_failure(choice: Choice) -> OpenAIError:
    """What a failed choice is answered with, whole or streamed: the caller's 400 naming the
    parameter when the engine found the request itself wrong (a schema whose grammar is too slow
    to sample, whether on its first token or on average after a few), else a 500."""
    last = choice.last
    if last is not None and last.error_kind is ErrorKind.INVALID:
        return refusal(last)
    return generation_failed(choice.error)


def choice_error(choice: Choice) -> dict:
    """What a failed choice carries beside `finish_reason: "error"`, whole or streamed (nothing
    for one that did not fail). A stream sends the error event only once every choice has failed:
    the official client stops reading there, and would lose choices still running or ended well."""
    return choice_failure(choice).body() if choice.error else {}


_C = TypeVar("_C", bound=Completion)
Chunk = Callable[..., str]  # (choices, **fields) -> one SSE event's JSON, in the route's shape


async def answer(request: Request, completion: _C, on_finish, reply: Callable[[_C], dict],
                 events: Callable[[], AsyncIterator[str]]):
    """Start the call's choices, then answer: its SSE events when it asked to stream, else its
    whole reply. A client that hangs up before the choices are queued cancels them: starting
    an n > 1 call evaluates its whole prompt first, which a long prompt makes seconds of prefill."""
    completion.submit()  # before any await: the session and the room are claimed at once
    starting = asyncio.ensure_future(completion.start())
    try:
        if not await _until_done_or_gone(request, starting):
            return _hung_up(completion, on_finish)
        starting.result()  # a refusal (OpenAIError) is answered as such
    except BaseException:
        starting.cancel()
        completion.cancel()
        raise
    if completion.call.stream:
        return EventSourceResponse(events(), ping=15, headers={"Cache-Control": "no-cache"})
    return await answer_whole(request, completion, on_finish, reply)


async def stream_events(completion: Completion, on_finish, chunk: Chunk, piece: Callable[[Delta], dict],
                        opening: Iterable[dict] = ()) -> AsyncIterator[str]:
    """A streamed call's SSE events: `opening` choices first, then each delta as one choice,
    `piece(delta)` giving its content in the route's shape; the timings ride on the chunk that
    ends the last choice, usage on its own chunk when asked, then [DONE]. Leaving early (the
    client hung up) cancels the call; `on_finish` hears once how it ended."""
    outcome = Outcome.CANCELLED
    try:
        for choice in opening:
            yield chunk([choice])
        async for d in completion.deltas():
            failed = completion.choices[d.index] if d.error is not None else None
            if failed is not None and all(c.error for c in completion.choices):
                yield json.dumps(choice_failure(failed).body())  # see choice_error
                continue
            extra = {}
            if d.done and all(c.done for c in completion.choices):
                extra["timings"] = completion.timings()
            yield chunk([{"index": d.index, **piece(d), "finish_reason": "error" if d.error else d.finish_reason,
                          **(choice_error(failed) if failed is not None else {})}], **extra)
        if completion.call.include_usage:
            yield chunk([], usage=completion.usage())
        yield "[DONE]"
        outcome = Outcome.ERROR if any(c.error for c in completion.choices) else Outcome.OK
    finally:
        if outcome is Outcome.CANCELLED:
            completion.cancel()
        if on_finish is not None:
            on_finish(completion, outcome)


async def _until_done_or_gone(request: Request, task: asyncio.Future) -> bool:
    """Wait for `task`, looking every 0.1 s whether the client hung up: True when the task is
    done, False (the task cancelled) when the client went away first."""
    while not task.done():
        await asyncio.wait({task}, timeout=0.1)
        if not task.done() and await request.is_disconnected() and not task.done():  # done meanwhile: its result is read
            task.cancel()
            return False
    return True


def _hung_up(completion: Completion, on_finish) -> JSONResponse:
    completion.cancel()
    if on_finish is not None:
        on_finish(completion, Outcome.CANCELLED)
    return JSONResponse({}, status_code=499)


async def answer_whole(request: Request, completion: _C, on_finish, reply: Callable[[_C], dict]) -> JSONResponse:
    """Wait for every choice, then answer `reply(completion)`; a client that hangs up meanwhile
    cancels the call (chat and text completions alike)."""
    run = asyncio.ensure_future(completion.run_to_end())
    try:
        if not await _until_done_or_gone(request, run):
            return _hung_up(completion, on_finish)
        run.result()
    except BaseException:
        completion.cancel()
        raise
    failed = [c for c in completion.choices if c.error]
    if on_finish is not None:
        on_finish(completion, Outcome.ERROR if failed else Outcome.OK)
    if failed and len(failed) == len(completion.choices):
        # Answered here, not raised: the call ran (its log line is written). A request the engine
        # found wrong (a schema too slow to sample, before or after it wrote) is the caller's 400.
        error = choice_failure(failed[0])
        return JSONResponse(error.body(), status_code=error.status)
    return JSONResponse(reply(completion))
