"""Provides run_request: one chat-completions request streamed from the pool's servers, with
bounded retries and a clear error for every way it can fail."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from contextlib import aclosing
from typing import Callable

import httpx

from magnitude_tui.remote.config import RemoteConfig, base_url
from magnitude_tui.remote.metrics import RemoteSeq
from magnitude_tui.remote.pool import Endpoint, EndpointPool, NoEndpoint
from magnitude_tui.remote.stream import DONE, Chunk, MalformedStream, ServerError, context_exceeded, events
from scheduler.types import DoneReason, ErrorKind, Message, Phase, Request, ToolChoiceMode

RETRY_STATUS = (429, 500, 502, 503, 504)


class RequestFailed(RuntimeError):
    """This request cannot be answered; the message says why and what to do. `kind` is
    CONTEXT_LENGTH when the server said the prompt does not fit its context (an agent then cuts
    its newest tool results and asks again), else None."""

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.kind = kind


STALE_WINDOW_S = 0.25  # a hang-up this soon after a request went out on a kept-alive connection is its closing


class _StaleConnection(Exception):
    """The server closed a kept-alive connection as this request went out on it (its idle
    keep-alive timeout crossed the request): nothing was answered, and the server is fine."""


class _Retry(Exception):
    def __init__(self, why: str, wait_s: float, endpoint_dead: bool = False) -> None:
        super().__init__(why)
        self.why, self.wait_s, self.endpoint_dead = why, wait_s, endpoint_dead


def request_body(request: Request, model: str) -> dict:
    s = request.sampling
    body = {
        "model": model,
        "messages": [_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": s.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        # Not in OpenAI's own API, but vLLM, SGLang and llama-server all take them.
        "top_k": s.top_k,
        "min_p": s.min_p,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    body.update(tool_fields(request))
    return body


def _message(m: Message) -> dict:
    """One turn in OpenAI's shape: an assistant turn keeps its calls, a tool turn its call id."""
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out


def tool_fields(request: Request) -> dict:
    """`tools`, `tool_choice`, `parallel_tool_calls` and `response_format` as OpenAI takes them
    (vLLM, SGLang and llama-server `--jinja` alike); none of them for a plain chat request."""
    out: dict = {}
    if request.tools:
        out["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": json.loads(t.parameters)}}
                        for t in request.tools]
        choice = request.tool_choice
        out["tool_choice"] = ({"type": "function", "function": {"name": choice.name}}
                              if choice.mode is ToolChoiceMode.FUNCTION else choice.mode.value)
        out["parallel_tool_calls"] = request.parallel_tool_calls
    if request.response_schema is not None:
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "reply", "schema": json.loads(request.response_schema), "strict": True}}
    return out


def retry_after_s(response: httpx.Response, attempt: int, cap: float) -> float:
    """Retry-After in seconds or as an HTTP date; without one, 0.5 s doubling per attempt."""
    raw = response.headers.get("retry-after")
    wait = 0.5 * 2 ** attempt
    if raw:
        try:
            wait = float(raw)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(raw)
            except (TypeError, ValueError, IndexError):
                when = None  # neither seconds nor a date: the doubling wait stands
            if when is not None:
                wait = when.timestamp() - time.time()
    return min(cap, max(0.0, wait))


async def run_request(seq: RemoteSeq, *, pool: EndpointPool, http: httpx.AsyncClient, config: RemoteConfig,
                      model: str, changed: Callable[[RemoteSeq], None], prefer: str | None = None) -> None:
    """Stream one request to its end; `changed(seq)` after every state change. Ends with the
    sequence finished (stop, length or error); cancelling the task closes the stream, which
    frees the server's slot."""
    failed: set[str] = set()  # servers this request found dead
    attempt = 0
    last_why = ""  # what the last try met, said first when no server is left to try
    while True:
        try:
            endpoint = pool.pick(avoid=failed, prefer=prefer)
        except NoEndpoint as exc:
            raise RequestFailed(f"{last_why}; {exc}" if last_why else str(exc)) from None
        if endpoint.in_flight >= endpoint.limit:
            seq.phase = Phase.QUEUED
            seq.waiting_reason = f"waiting for a slot on {endpoint.url} ({endpoint.in_flight} in flight)"
            changed(seq)
        await endpoint.acquire()
        try:
            try:
                await _stream(seq, endpoint, attempt, http=http, config=config, model=model, changed=changed)
            except _StaleConnection:
                # Once more on a connection of its own, to the same server; a hang-up there is real.
                async with fresh_client(http) as fresh:
                    await _stream(seq, endpoint, attempt, http=fresh, config=config, model=model, changed=changed,
                                  may_be_stale=False)
            return
        except _Retry as retry:
            last_why = retry.why
            if retry.endpoint_dead:
                failed.add(endpoint.url)
            attempt += 1
            if attempt > config.max_retries:
                raise RequestFailed(f"{retry.why}; gave up after {config.max_retries} retries") from None
            wait = retry.wait_s
            seq.phase, seq.waiting_reason = Phase.QUEUED, f"{retry.why}; retrying in {wait:.1f} s"
            changed(seq)
        finally:
            endpoint.release()
        await asyncio.sleep(wait)


async def _stream(seq: RemoteSeq, endpoint: Endpoint, attempt: int, *, http: httpx.AsyncClient, config: RemoteConfig,
                  model: str, changed: Callable[[RemoteSeq], None], may_be_stale: bool = True) -> None:
    url = base_url(endpoint.url) + "/chat/completions"
    seq.sent(endpoint.url)
    changed(seq)
    got_text = False
    answered = False  # the server sent its response's head: from then on a break is mid-reply
    connected = False  # this request opened its connection (else it went on a kept-alive one)
    body_sent: float | None = None  # when the whole request had gone out (time.monotonic())

    async def trace(event: str, info: dict) -> None:
        nonlocal connected, body_sent
        if event.startswith("connection.connect_"):  # httpcore's connect_tcp / connect_unix_socket
            connected = True
        elif event == "http11.send_request_body.complete":
            body_sent = time.monotonic()

    try:
        async with http.stream("POST", url, json=request_body(seq.request, model),
                               extensions={"trace": trace}) as response:
            answered = True
            if response.status_code != 200:
                await _refuse(response, endpoint, model, config, attempt)
            finish_reason = None
            chunks = 0
            async with aclosing(events(response.aiter_lines())) as stream:
                async for item in stream:
                    if item is DONE:
                        break
                    assert isinstance(item, Chunk)
                    chunk = item
                    chunks += 1
                    if chunk.text:
                        seq.delta(chunk.text)  # the first one stamps the first-token time
                    if chunk.tool_calls:
                        seq.tool_delta(chunk.tool_calls)  # so does a call's first piece
                    if chunk.text or chunk.tool_calls:
                        if not got_text:
                            got_text = True
                            assert seq.ttft_ms is not None  # sent, and the first piece just stamped
                            endpoint.on_first_token(seq.ttft_ms)
                        endpoint.on_tokens(1)
                        changed(seq)
                    if chunk.usage is not None:
                        seq.usage = chunk.usage
                    if chunk.timings is not None:
                        seq.timings = chunk.timings
                    if chunk.finish_reason is not None:
                        finish_reason = chunk.finish_reason
            if finish_reason is None and not chunks:
                # The server is up (it answered) but said nothing: llama-cpp-python's server does
                # this for a streamed prompt longer than its context. Not a dead server, not
                # "mid-reply": nothing was said.
                endpoint.error("an empty stream")
                raise RequestFailed(f"{endpoint.url} answered 200 with an empty stream: no reply and no error. "
                                    "It may have refused the prompt without saying why (llama-cpp-python's "
                                    "server does this for a prompt longer than its context)")
            if finish_reason is None:
                endpoint.mark_dead("a stream ended mid-reply")
                raise RequestFailed(f"the stream from {endpoint.url} ended mid-reply (no finish_reason); "
                                    "the server may have stopped. Other servers take new work")
    except httpx.ConnectError as exc:
        endpoint.mark_dead(f"connection refused ({exc})")
        raise _Retry(f"{endpoint.url} refused the connection; is the server running?", 0.0,
                     endpoint_dead=True) from None
    except httpx.TimeoutException as exc:
        endpoint.error("timeout")
        what = "connect" if isinstance(exc, httpx.ConnectTimeout) else "answer"
        limit = config.connect_timeout_s if what == "connect" else config.read_timeout_s
        raise RequestFailed(f"{endpoint.url} did not {what} within {limit:g} s (timeout)") from None
    except (httpx.RemoteProtocolError, httpx.NetworkError) as exc:  # read, write or close broke
        # A kept-alive connection the server had closed fails at once: while the request goes out,
        # or as its answer is first read. A server that took the request and then went away (it
        # worked on it, it crashed) is not asked again: that would run the completion twice.
        at_once = body_sent is None or time.monotonic() - body_sent < STALE_WINDOW_S
        if not answered and not connected and may_be_stale and at_once:
            raise _StaleConnection() from None
        endpoint.mark_dead(f"stream broke ({type(exc).__name__})")
        if not answered:  # it went away before answering: nothing was shown, another server may answer
            raise _Retry(f"{endpoint.url} closed the connection without answering "
                         f"({str(exc) or type(exc).__name__})", 0.0, endpoint_dead=True) from None
        raise RequestFailed(f"the connection to {endpoint.url} broke mid-reply ({str(exc) or type(exc).__name__}); "
                            "the server may have stopped. Other servers take new work") from None
    except httpx.DecodingError as exc:  # a body that its content-encoding does not decode
        endpoint.error("malformed stream")
        raise RequestFailed(f"{endpoint.url} sent a malformed stream: its body does not decode "
                            f"({str(exc) or type(exc).__name__})") from None
    except MalformedStream as exc:
        endpoint.error("malformed stream")
        raise RequestFailed(f"{endpoint.url} sent a malformed stream: {exc}") from None
    except ServerError as exc:
        endpoint.error(str(exc))
        raise RequestFailed(f"{endpoint.url}: {exc}",
                            ErrorKind.CONTEXT_LENGTH if exc.context_exceeded else None) from None
    seq.finish(DoneReason.LENGTH if finish_reason == "length" else DoneReason.STOP)


def fresh_client(http: httpx.AsyncClient) -> httpx.AsyncClient:
    """A client like `http` (its timeouts and headers, the API key among them) that keeps no
    connection: its one request opens a new one."""
    return httpx.AsyncClient(timeout=http.timeout, headers=http.headers,
                             limits=httpx.Limits(max_connections=1, max_keepalive_connections=0))


async def _refuse(response: httpx.Response, endpoint: Endpoint, model: str, config: RemoteConfig,
                  attempt: int) -> None:
    """Turn a non-200 answer into a retry (429, 5xx) or a clear failure (the rest)."""
    body = (await response.aread()).decode(errors="replace")
    detail = error_message(body)
    code = response.status_code
    if code in RETRY_STATUS:
        endpoint.error(f"HTTP {code}")
        wait = retry_after_s(response, attempt, config.max_retry_wait_s)
        raise _Retry(f"{endpoint.url} answered {code} ({detail or 'busy'})", wait)
    endpoint.error(f"HTTP {code}")
    if code in (401, 403):
        raise RequestFailed(f"{endpoint.url} refused the API key ({code}: {detail}); pass the variable "
                            "that holds the key with --api-key-env")
    if code == 404:
        listed = f"; it serves: {', '.join(endpoint.models)}" if endpoint.models else ""
        raise RequestFailed(f"{endpoint.url} does not serve model {model!r} (404: {detail}){listed}; "
                            "choose one with --remote-model")
    if context_exceeded(_json(body)):
        raise RequestFailed(f"{endpoint.url}: the prompt does not fit the server's context ({code}: {detail})",
                            ErrorKind.CONTEXT_LENGTH)
    raise RequestFailed(f"{endpoint.url} rejected the request ({code}: {detail})")


def _json(body: str) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


def error_message(body: str) -> str:
    """The message of an OpenAI-style error body, else the body's start."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body.strip()[:200]
    if isinstance(err, dict):
        return str(err.get("message", err))[:200]
    return str(err or body)[:200]
