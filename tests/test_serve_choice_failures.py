"""One failed choice of an n > 1 call, streamed: the official client still gets the others.

The engine side is stood in for by a scripted Completion (which choice fails, and when, is the
point); the SSE the routes write is read back by the official `openai` client over an httpx
transport, as it would be from the network."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import openai
import pytest

from magnitude_tui.serve import app as chat_route
from magnitude_tui.serve import text_completion as text_route
from magnitude_tui.serve.calls import ServeOptions
from magnitude_tui.serve.completion import Choice, Delta


class ScriptedCompletion:
    """What the stream functions read of a Completion, its choices ending as scripted."""

    def __init__(self, script: list[Delta], n: int) -> None:
        self.id = "cmpl-test"
        self.created = 0
        self.choices = [Choice(i, f"r{i}") for i in range(n)]
        self.call = SimpleNamespace(include_usage=False)
        self.script = script
        self.cancelled = False

    async def deltas(self):
        for d in self.script:
            c = self.choices[d.index]
            c.text += d.text
            c.error = d.error or c.error
            c.finish_reason = d.finish_reason or c.finish_reason
            yield d

    def timings(self) -> dict:
        return {}

    def usage(self) -> dict:
        return {}

    def cancel(self) -> None:
        self.cancelled = True


def _sse(stream_fn, completion) -> bytes:
    async def collect() -> list[str]:
        return [event async for event in stream_fn(completion, ServeOptions(model_name="m"), None)]
    return b"".join(f"data: {e}\n\n".encode() for e in asyncio.run(collect()))


def _client(body: bytes) -> openai.OpenAI:
    transport = httpx.MockTransport(lambda request: httpx.Response(
        200, content=body, headers={"content-type": "text/event-stream"}))
    return openai.OpenAI(base_url="http://serve.test/v1", api_key="none", max_retries=0,
                         http_client=httpx.Client(transport=transport))


ONE_FAILS = [Delta(0, text="Hel"), Delta(1, text="Bo"), Delta(1, error="the reply is not JSON"),
             Delta(0, text="lo"), Delta(0, finish_reason="stop")]
BOTH_FAIL = [Delta(0, text="Hel"), Delta(1, error="first failure"), Delta(0, error="second failure")]


def test_a_streamed_chat_choice_that_fails_ends_alone_and_the_other_choice_arrives_whole():
    body = _sse(chat_route._stream, ScriptedCompletion(ONE_FAILS, 2))
    chunks = list(_client(body).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                        n=2, stream=True))
    text = {0: "", 1: ""}
    finish = {}
    for chunk in chunks:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {0: "Hello", 1: "Bo"} and finish == {0: "stop", 1: "error"}
    failed = next(c for chunk in chunks for c in chunk.choices if c.finish_reason == "error")
    assert failed.model_extra["error"]["message"] == "the reply is not JSON"


def test_a_streamed_text_choice_that_fails_ends_alone_and_the_other_choice_arrives_whole():
    body = _sse(text_route._stream, ScriptedCompletion(ONE_FAILS, 2))
    chunks = list(_client(body).completions.create(model="m", prompt="x", n=2, stream=True))
    text = {0: "", 1: ""}
    finish = {}
    for chunk in chunks:
        for c in chunk.choices:
            text[c.index] += c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {0: "Hello", 1: "Bo"} and finish == {0: "stop", 1: "error"}


@pytest.mark.parametrize("route", [chat_route, text_route])
def test_when_every_choice_failed_the_stream_ends_with_an_error_the_client_raises(route):
    body = _sse(route._stream, ScriptedCompletion(BOTH_FAIL, 2))
    client = _client(body)
    with pytest.raises(openai.APIError, match="second failure"):
        if route is chat_route:
            list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                n=2, stream=True))
        else:
            list(client.completions.create(model="m", prompt="x", n=2, stream=True))


def test_one_choice_streamed_alone_still_fails_with_an_error_event():
    body = _sse(chat_route._stream, ScriptedCompletion([Delta(0, text="a"), Delta(0, error="cut short")], 1))
    with pytest.raises(openai.APIError, match="cut short"):
        list(_client(body).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                   stream=True))
