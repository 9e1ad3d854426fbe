"""Provides the OpenAI-compatible HTTP app: /v1/chat/completions (SSE or not), /v1/models, /health."""

from __future__ import annotations

import json
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from magnitude_tui.serve.body import parse_chat
from magnitude_tui.serve.calls import (
    Outcome,
    ServeOptions,
    address,
    answer,
    authorize,
    check_room,
    choice_error,
    not_ready,
    stream_events,
    take_body,
)
from magnitude_tui.serve.completion import Choice, Completion, Delta
from magnitude_tui.serve.errors import ErrorType, OpenAIError
from magnitude_tui.serve.guard import RequestGuard
from magnitude_tui.serve.hub import EngineHub, EngineState
from magnitude_tui.serve.text_completion import register
from magnitude_tui.serve.tool_calls import delta_json, message_json


def create_app(hub: EngineHub, options: ServeOptions = ServeOptions(), *,
               on_finish: Callable[[Completion, Outcome], None] | None = None,
               on_refused: Callable[[str, OpenAIError], None] | None = None) -> FastAPI:
    """The HTTP app over one engine hub. `on_finish(completion, outcome)` is called once per call
    that ran, `on_refused(caller address, error)` once per call answered with an error before
    anything ran (log lines in the headless server; /health is not a call)."""
    api = FastAPI(title="magnitude-tui", docs_url=None, redoc_url=None, openapi_url=None)
    # Added first, so it runs inside CORS: the 500 goes out through CORS's headers like any answer.
    api.add_middleware(UnexpectedErrors)
    if options.guard is not None:
        if options.guard.origins:  # the pages allowed to call get CORS answers (preflight included)
            api.add_middleware(CORSMiddleware, allow_origins=sorted(options.guard.origins),
                               allow_methods=["GET", "POST"], allow_headers=["authorization", "content-type"])
        api.add_middleware(RequestGuard, policy=options.guard, on_refused=on_refused)

    @api.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        if on_refused is not None and request.url.path != "/health":
            on_refused(address(request), exc)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @api.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        # Routing's own answers (no such path, wrong method) in the same shape as every other error.
        kind = ErrorType.NOT_FOUND if exc.status_code == 404 else ErrorType.INVALID_REQUEST
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        error = OpenAIError(exc.status_code, f"{exc.detail} ({request.method} {request.url.path[:200]})", kind, code)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @api.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The backstop for a failure in the middlewares themselves (UnexpectedErrors answers a
        # route's); Starlette runs this handler outside every middleware, CORS included.
        return _internal_error()

    @api.get("/health")
    async def health() -> JSONResponse:
        if hub.state is EngineState.READY and not hub.draining:
            return JSONResponse({"status": "ok"})
        raise not_ready(hub)

    @api.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorize(request, options)
        return JSONResponse({"object": "list", "data": [_model_json(options)]})

    @api.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> JSONResponse:
        # The openai client's models.retrieve(); an unknown id is OpenAI's 404.
        authorize(request, options)
        if model_id != options.model_name:
            raise OpenAIError(404, f"the model {model_id[:200]!r} does not exist (this server serves "
                              f"{options.model_name!r})", ErrorType.NOT_FOUND, "model_not_found", "model")
        return JSONResponse(_model_json(options))

    @api.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await take_body(request, hub, options)
        call = parse_chat(body, default_max_tokens=options.default_max_tokens or hub.context_per_sequence)
        check_room(hub, options, call.n)
        completion = Completion(hub, call, client_name=call.user or address(request))
        return await answer(request, completion, on_finish, lambda c: _chat_reply(c, options),
                            lambda: _stream(completion, options, on_finish))

    register(api, hub, options, on_finish)  # POST /v1/completions: a raw prompt, no chat template
    return api


def _internal_error() -> JSONResponse:
    # A bug, not the caller's fault: the OpenAI shape in fixed words (uvicorn still logs the
    # traceback), never Starlette's bare-text "Internal Server Error" that clients cannot read.
    error = OpenAIError(500, "the server failed on this request", ErrorType.SERVER, "internal_error")
    return JSONResponse(error.body(), status_code=500)


class UnexpectedErrors:
    """ASGI middleware: an exception out of a route is answered 500 `internal_error` here, inside
    CORS, so a page allowed to call can read it (Starlette's own handler for Exception runs
    outside every middleware: its 500 had no Access-Control-Allow-Origin). The exception is
    raised on, so the server still logs its traceback; a response already started is only ended."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception:
            if not started:
                await _internal_error()(scope, receive, send)
            raise


def _model_json(options: ServeOptions) -> dict:
    return {"id": options.model_name, "object": "model", "created": 0, "owned_by": "magnitude-tui"}


def _message(c: Choice) -> dict:
    if not c.calls:
        return {"role": "assistant", "content": c.text}
    return {"role": "assistant", "content": c.text or None, "tool_calls": message_json(c.calls)}


def _chunk(completion: Completion, options: ServeOptions, choices: list[dict], **extra) -> str:
    body = {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
            "model": options.model_name, "choices": choices, **extra}
    return json.dumps(body, ensure_ascii=False)


def _piece(d: Delta) -> dict:
    delta: dict = {"content": d.text} if d.text else {}
    if d.tool_calls:
        delta["tool_calls"] = delta_json(d.tool_calls)
    return {"delta": delta}


def _stream(completion: Completion, options: ServeOptions, on_finish):
    opening = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
               for c in completion.choices]
    return stream_events(completion, on_finish, lambda choices, **extra: _chunk(completion, options, choices, **extra),
                         _piece, opening)


def _chat_reply(completion: Completion, options: ServeOptions) -> dict:
    return {
        "id": completion.id, "object": "chat.completion", "created": completion.created,
        "model": options.model_name,
        "choices": [{"index": c.index, "message": _message(c), "finish_reason": c.finish_reason or "error",
                     **choice_error(c)} for c in completion.choices],
        "usage": completion.usage(),
        "timings": completion.timings(),
    }
