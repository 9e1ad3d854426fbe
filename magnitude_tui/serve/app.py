"""Provides the OpenAI-compatible HTTP app: /v1/chat/completions (SSE or not), /v1/models, /health."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, TypeVar

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from magnitude_tui.serve.body import parse_chat
from magnitude_tui.serve.completion import Choice, Completion
from magnitude_tui.serve.tool_calls import delta_json, message_json
from magnitude_tui.serve.errors import ErrorType, OpenAIError, invalid
from magnitude_tui.serve.guard import GuardPolicy, RequestGuard
from magnitude_tui.serve.hub import EngineHub, EngineState

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


def create_app(hub: EngineHub, options: ServeOptions = ServeOptions(), *,
               on_finish: Callable[[Completion, Outcome], None] | None = None,
               on_refused: Callable[[str, OpenAIError], None] | None = None) -> FastAPI:
    """The HTTP app over one engine hub. `on_finish(completion, outcome)` is called once per call
    that ran, `on_refused(caller address, error)` once per call answered with an error before
    anything ran (log lines in the headless server; /health is not a call)."""
    api = FastAPI(title="magnitude-tui", docs_url=None, redoc_url=None, openapi_url=None)
    if options.guard is not None:
        if options.guard.origins:  # the pages allowed to call get CORS answers (preflight included)
            api.add_middleware(CORSMiddleware, allow_origins=sorted(options.guard.origins),
                               allow_methods=["GET", "POST"], allow_headers=["authorization", "content-type"])
        api.add_middleware(RequestGuard, policy=options.guard, on_refused=on_refused)

    @api.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        if on_refused is not None and request.url.path != "/health":
            on_refused(_address(request), exc)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @api.get("/health")
    async def health() -> JSONResponse:
        if hub.state is EngineState.READY and not hub.draining:
            return JSONResponse({"status": "ok"})
        raise _not_ready(hub)

    @api.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _authorize(request, options)
        return JSONResponse({"object": "list", "data": [
            {"id": options.model_name, "object": "model", "created": 0, "owned_by": "magnitude-tui"}]})

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        _authorize(request, options)
        body = await _read_json(request, options.max_body_bytes)
        if hub.state is not EngineState.READY or hub.draining:
            raise _not_ready(hub)
        limit = options.default_max_tokens or hub.context_per_sequence
        call = parse_chat(body, default_max_tokens=limit)
        if hub.num_live + call.n > options.max_live:
            raise OpenAIError(429, f"too many requests in flight ({hub.num_live} of {options.max_live}); "
                              "retry shortly", ErrorType.RATE_LIMIT, "queue_full", retry_after_s=1)
        completion = Completion(hub, call, client_name=call.user or _address(request))
        try:
            await completion.start()
        except asyncio.CancelledError:
            completion.cancel()
            raise
        if call.stream:
            return EventSourceResponse(_stream(completion, options, on_finish), ping=15,
                                       headers={"Cache-Control": "no-cache"})
        return await answer_whole(request, completion, on_finish, lambda c: _chat_reply(c, options))

    from magnitude_tui.serve.text_completion import register  # it imports this module's helpers
    register(api, hub, options, on_finish)  # POST /v1/completions: a raw prompt, no chat template
    return api


def _message(c: Choice) -> dict:
    if not c.calls:
        return {"role": "assistant", "content": c.text}
    return {"role": "assistant", "content": c.text or None, "tool_calls": message_json(c.calls)}


def _address(request: Request) -> str:
    return f"api@{request.client.host}" if request.client else "api"


def _not_ready(hub: EngineHub) -> OpenAIError:
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


def _authorize(request: Request, options: ServeOptions) -> None:
    if options.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), options.api_key):
        raise OpenAIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                          ErrorType.AUTHENTICATION, "invalid_api_key")


async def _read_json(request: Request, limit: int) -> object:
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
    if not _nesting_within(body, MAX_JSON_DEPTH):
        raise too_deep
    return body


def _nesting_within(value: object, limit: int) -> bool:
    """Whether no object or array in `value` lies more than `limit` levels deep (walked without
    recursion, so a hostile body cannot exhaust the stack of whatever reads it next)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return False
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def _chunk(completion: Completion, options: ServeOptions, choices: list[dict], **extra) -> str:
    body = {"id": completion.id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": options.model_name, "choices": choices, **extra}
    return json.dumps(body, ensure_ascii=False)


async def _stream(completion: Completion, options: ServeOptions, on_finish):
    outcome = Outcome.CANCELLED
    try:
        for c in completion.choices:
            yield _chunk(completion, options, [{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}])
        async for d in completion.deltas():
            if d.error is not None:
                yield json.dumps({"error": {"message": d.error, "type": ErrorType.SERVER.value,
                                            "code": "generation_failed", "param": None}})
                continue
            delta = {"content": d.text} if d.text else {}
            if d.tool_calls:
                delta["tool_calls"] = delta_json(d.tool_calls)
            extra = {}
            if d.finish_reason is not None and all(c.done for c in completion.choices):
                extra["timings"] = completion.timings()
            yield _chunk(completion, options, [{"index": d.index, "delta": delta,
                                                "finish_reason": d.finish_reason}], **extra)
        if completion.call.include_usage:
            yield _chunk(completion, options, [], usage=completion.usage())
        yield "[DONE]"
        outcome = Outcome.ERROR if any(c.error for c in completion.choices) else Outcome.OK
    finally:
        if outcome is Outcome.CANCELLED:
            completion.cancel()
        if on_finish is not None:
            on_finish(completion, outcome)


_C = TypeVar("_C", bound=Completion)


async def answer_whole(request: Request, completion: _C, on_finish, reply: Callable[[_C], dict]) -> JSONResponse:
    """Wait for every choice, then answer `reply(completion)`; a client that hangs up meanwhile
    cancels the call (chat and text completions alike)."""
    run = asyncio.ensure_future(completion.run_to_end())
    try:
        while not run.done():
            await asyncio.wait({run}, timeout=0.1)
            if not run.done() and await request.is_disconnected():
                run.cancel()
                completion.cancel()
                if on_finish is not None:
                    on_finish(completion, Outcome.CANCELLED)
                return JSONResponse({}, status_code=499)
        run.result()
    except BaseException:
        completion.cancel()
        raise
    failed = [c for c in completion.choices if c.error]
    if on_finish is not None:
        on_finish(completion, Outcome.ERROR if failed else Outcome.OK)
    if failed and len(failed) == len(completion.choices):
        # Answered here, not raised: the call ran (its log line is written), it was not refused.
        error = OpenAIError(500, failed[0].error or "generation failed", ErrorType.SERVER, "generation_failed")
        return JSONResponse(error.body(), status_code=error.status)
    return JSONResponse(reply(completion))


def _chat_reply(completion: Completion, options: ServeOptions) -> dict:
    return {
        "id": completion.id, "object": "chat.completion", "created": int(time.time()),
        "model": options.model_name,
        "choices": [{"index": c.index, "message": _message(c), "finish_reason": c.finish_reason or "error"}
                    for c in completion.choices],
        "usage": completion.usage(),
        "timings": completion.timings(),
    }
