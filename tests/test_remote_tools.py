"""The remote engine with tools and schemas: what it sends (tools, tool_choice, parallel_tool_calls,
response_format, tool turns) and the streamed `delta.tool_calls` it turns back into SeqUpdates."""

from __future__ import annotations

import json
import time

import pytest

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig, SeqUpdate
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from magnitude_tui.remote.metrics import RemoteSeq
from magnitude_tui.remote.request import request_body
from magnitude_tui.remote.stream import MalformedStream, parse_chunk
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.thread import serve_in_thread
from scheduler.types import (
    DoneReason,
    Message,
    Phase,
    Request,
    SamplingParams,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolChoiceMode,
)

WEATHER = Tool("get_weather", "The weather in a city", json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _request(max_tokens: int = 200, **kw) -> Request:
    return Request("r1", "s1", (Message("user", "weather in Oslo?"),), SamplingParams(max_tokens=max_tokens), **kw)


def test_the_body_carries_tools_choice_and_tool_turns():
    history = (Message("user", "weather in Oslo?"),
               Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),)),
               Message("tool", "sunny", tool_call_id="call_1", name="get_weather"))
    req = Request("r1", "s1", history, SamplingParams(max_tokens=8), tools=(WEATHER,),
                  tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "get_weather"), parallel_tool_calls=False)
    body = request_body(req, "m")
    assert body["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": json.loads(WEATHER.parameters)}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert "response_format" not in body
    assert body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}
    assert body["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}
    assert request_body(_request(tools=(WEATHER,)), "m")["tool_choice"] == "auto"


def test_the_body_carries_a_response_schema_and_nothing_for_plain_chat():
    body = request_body(_request(response_schema=json.dumps(SCHEMA)), "m")
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}
    plain = request_body(_request(), "m")
    assert not {"tools", "tool_choice", "parallel_tool_calls", "response_format"} & set(plain)
    assert plain["messages"] == [{"role": "user", "content": "weather in Oslo?"}]


def test_streamed_tool_call_pieces_become_deltas():
    first = parse_chunk(json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]},
        "finish_reason": None}]}))
    assert first.tool_calls == (ToolCallDelta(0, "call_a", "get_weather", ""),) and first.text == ""
    more = parse_chunk(json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": '{"city":'}}]}}]}))
    assert more.tool_calls == (ToolCallDelta(0, None, None, '{"city":'),)
    with pytest.raises(MalformedStream, match="integer 'index'"):
        parse_chunk(json.dumps({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]}))
    with pytest.raises(MalformedStream, match="not a list"):
        parse_chunk(json.dumps({"choices": [{"delta": {"tool_calls": {"index": 0}}}]}))


def test_a_call_is_named_once_even_when_a_server_repeats_its_id():
    seq = RemoteSeq(_request(tools=(WEATHER,)))
    seq.sent("http://x")
    seq.tool_delta((ToolCallDelta(0, "call_a", "get_weather", '{"ci'),))
    seq.tool_delta((ToolCallDelta(0, "call_a", "get_weather", 'ty": "Oslo"}'), ToolCallDelta(1, None, "f", "{}")))
    update = seq.update()
    assert [d.id for d in update.tool_calls] == ["call_a", None, "call_r1_1"]
    assert seq.tool_calls == (ToolCall("call_a", "get_weather", '{"city": "Oslo"}'), ToolCall("call_r1_1", "f", "{}"))
    assert update.phase is Phase.GENERATING and update.ttft_ms is not None
    assert seq.update().tool_calls == ()  # taken once


def _finals(client: RemoteClient, rids: set[str], timeout: float = 30.0) -> dict[str, list[SeqUpdate]]:
    seen: dict[str, list[SeqUpdate]] = {r: [] for r in rids}
    done: set[str] = set()
    deadline = time.monotonic() + timeout
    while done != rids:
        assert time.monotonic() < deadline, f"timed out: {seen}"
        for e in client.poll_events(0.1) or ():
            if isinstance(e, SeqUpdate) and e.request_id in rids:
                seen[e.request_id].append(e)
                if e.phase is Phase.DONE:
                    done.add(e.request_id)
    return seen


def test_tool_calls_round_trip_through_serve():
    """The remote engine against this project's own `serve` (fake backend scripted to call a tool):
    the body it sends is one serve accepts, and the streamed calls come back whole."""
    reply = call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Oslo"}')
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=4, reply=reply), policy="fixed:64")
    with serve_in_thread(config, ServeOptions(model_name="fake-model")) as server:
        client = RemoteClient(RemoteConfig((server.url,)))
        client.start()
        try:
            client.submit(_request(tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)))
            updates = _finals(client, {"r1"})["r1"]
        finally:
            client.stop()
    final = updates[-1]
    assert final.error is None and final.done_reason is DoneReason.STOP
    deltas = [d for u in updates for d in u.tool_calls]
    assert deltas[0].name == "get_weather" and deltas[0].id
    assert [d for d in deltas if d.id is not None] == deltas[:1]
    assert json.loads("".join(d.arguments for d in deltas)) == {"city": "Oslo"}
    assert "".join(u.text_delta for u in updates) == ""


@pytest.mark.slow
def test_a_schema_and_a_required_call_on_the_vendored_llama_server():
    """The same fields against llama-server --jinja on the real model: the schema reply validates,
    and a request with tools is accepted and answered. (With SmolLM2's template, which knows no
    tools, this llama-server answers tool_choice "required" with free text, so the call pieces
    are checked against `serve` above, not here.)"""
    from jsonschema import Draft202012Validator

    from backend.llama_load import default_model_path
    from magnitude_bench.peers import Server
    from tests.needs import llama_tools, need_real_model

    need_real_model()
    found = llama_tools()
    if found is None:
        pytest.skip("llama-server is not built here; scripts/build_llama_tools.sh --cpu builds it")
    person = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
              "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20}, "age": {"type": "integer"}}}
    with Server.on_cpu(found[0], model=str(default_model_path()), parallel=2, threads=1, n_ctx=4096,
                       extra=["--jinja"]) as srv:
        client = RemoteClient(RemoteConfig((f"http://127.0.0.1:{srv.port}",)))
        client.start()
        try:
            client.submit(Request("json", "s-json", (Message("user", "Invent a person."),),
                                  SamplingParams(temperature=0.0, max_tokens=48), response_schema=json.dumps(person)))
            client.submit(Request("call", "s-call", (Message("user", "What is the weather in Oslo?"),),
                                  SamplingParams(temperature=0.0, max_tokens=64), tools=(WEATHER,),
                                  tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)))
            seen = _finals(client, {"json", "call"}, timeout=300)
        finally:
            client.stop()
    assert all(u[-1].error is None for u in seen.values()), seen
    Draft202012Validator(person).validate(json.loads("".join(u.text_delta for u in seen["json"])))
    assert seen["call"][-1].done_reason in (DoneReason.STOP, DoneReason.LENGTH) and seen["call"][-1].generated > 0
