"""`serve` with tools and response_format on the fake backend: OpenAI shapes, `auto` mid-text, bad input."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import recording, running_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# The scripted model talks first, then opens a call by itself (tool_choice "auto").
REPLY = "Let me check. " + call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Paris"}')
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _config(reply: str) -> EngineConfig:
    return EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=8, reply=reply), policy="fixed:64")


@pytest.fixture(scope="module")
def server():
    with running_server(_config(REPLY), ServeOptions(model_name="fake")) as s:
        yield s


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=30)


def test_auto_streams_the_text_then_the_call_in_openai_delta_shapes(server):
    stream = _client(server).chat.completions.create(model="fake", messages=USER, tools=TOOLS, stream=True,
                                                     max_tokens=200)
    text, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                assert tc.type == "function" and call["id"] is None
                call["id"], call["name"] = tc.id, tc.function.name
            call["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert text == "Let me check. "
    assert finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_the_whole_reply_carries_message_tool_calls(server):
    r = _client(server).chat.completions.create(model="fake", messages=USER, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check. "
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.usage.completion_tokens == len(REPLY)


def test_tool_choice_none_leaves_the_call_as_text(server):
    r = _client(server).chat.completions.create(model="fake", messages=USER, tools=TOOLS, tool_choice="none",
                                                max_tokens=200)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == REPLY
    assert not r.choices[0].message.tool_calls


def test_a_tool_result_goes_back_and_the_history_is_accepted(server):
    history = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = _client(server).chat.completions.create(model="fake", messages=history, tools=TOOLS, tool_choice="none",
                                                max_tokens=5)
    assert r.choices[0].finish_reason == "length"


def test_a_call_cut_by_max_tokens_can_be_replayed_in_the_next_history(server):
    # A reply cut inside a call keeps the partial call (arguments that are not JSON) with finish
    # "length"; the Agents SDK replays that message in its next request, which was refused whole
    # with a 400 naming the arguments. OpenAI takes any string there: so does serve, as it is.
    cut = REPLY.index('"Paris"') + 3
    r = httpx.post(server.base + "/chat/completions", json={"messages": USER, "tools": TOOLS, "max_tokens": cut},
                   timeout=30)
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "length", r.text
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Pa'
    history = USER + [choice["message"], {"role": "user", "content": "go on"}]
    with recording(server) as reports:
        again = httpx.post(server.base + "/chat/completions", json={"messages": history, "tools": TOOLS,
                                                                   "max_tokens": 5}, timeout=30)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["finish_reason"] == "length"
    # The string went into the prompt as it is: the history's call is the model's own text up to the cut.
    prompt = next(u.prompt_total for rep in reports for u in rep.updates)
    replayed = USER + [{"role": "assistant", "content": choice["message"]["content"], "tool_calls": [
        {**call, "function": {**call["function"], "arguments": '{"city": "Paris"}'}}]}, history[-1]]
    whole = httpx.post(server.base + "/chat/completions", json={"messages": replayed, "tools": TOOLS,
                                                               "max_tokens": 1}, timeout=30).json()
    assert prompt == whole["usage"]["prompt_tokens"] - len('ris"}')


def test_a_call_of_an_unknown_function_is_an_error_not_a_call():
    reply = call_text(ToolSyntax.GENERIC, "launch_missiles", "{}")
    with running_server(_config(reply), ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "tools": TOOLS, "max_tokens": 100},
                       timeout=30)
    assert r.status_code == 500 and "launch_missiles" in r.json()["error"]["message"]


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": USER + [{"role": "tool", "tool_call_id": "call_x", "content": "r"}]}, "messages[1].tool_call_id"),
    ({"messages": USER + [{"role": "tool", "content": "r"}]}, "messages[1].tool_call_id"),
    # A history call's arguments may be any string (a reply cut mid-call); not a string, no name: malformed.
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
                                                                                      "arguments": {"a": 1}}}]}]},
     "messages[1].tool_calls[0]"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}]},
     "messages[1].tool_calls[0]"),
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"type": "function"}]}]}, "messages[1].tool_calls[0]"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 12}}}},
     "response_format.json_schema.schema"),
    ({"parallel_tool_calls": "yes", "tools": TOOLS}, "parallel_tool_calls"),
    # A call's arguments are an object: parameters of another type could never validate.
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    # Valid JSON schemas that the grammar converter cannot express: refused by the engine, alone.
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/gone"}}}},
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/definitions/gone"}}}],
      "tool_choice": "required"}, "tools"),
    # Bounds the grammar would spell out past what llama.cpp's parser takes (20,000 levels crashed it).
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "maxLength": 20000}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {  # froze the engine
        "type": "string", "pattern": "^((a{0,20}){0,20}){0,20}$"}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "array", "items": {"type": "integer"}, "maxItems": 30000}}}}}], "tool_choice": "required"},
     "tools"),
]


@pytest.mark.parametrize("extra, param", BAD)
def test_bad_tool_input_is_a_400_naming_the_parameter_while_a_good_stream_completes(server, extra, param):
    good: dict = {}

    def good_stream():
        chunks = _client(server).chat.completions.create(model="fake", messages=USER, max_tokens=30, stream=True)
        good["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    t = threading.Thread(target=good_stream)
    t.start()
    r = httpx.post(server.base + "/chat/completions", json={"messages": USER, "max_tokens": 20, **extra}, timeout=30)
    t.join(30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert good["text"] == REPLY[:30]


def test_a_reply_outside_bounds_the_grammar_cannot_express_is_an_error_not_a_stop():
    schema = {"type": "object", "properties": {"age": {"type": "integer", "maximum": 120}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    with running_server(_config('{"age": 999}'), ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "response_format": fmt,
                                                          "max_tokens": 50}, timeout=30)
        assert r.status_code == 500 and "999" in r.json()["error"]["message"]
        ok = httpx.post(s.base + "/chat/completions", json={"messages": USER, "max_tokens": 50, "response_format": {
            "type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}}, timeout=30)
        assert ok.status_code == 200 and json.loads(ok.json()["choices"][0]["message"]["content"]) == {"age": 999}


@pytest.mark.parametrize("cut_after", ['\n<tool_call>\n{"name": "get_wea', "\n<tool_c"])
def test_a_call_the_token_limit_cuts_after_whole_calls_leaves_no_scaffolding_in_content(cut_after):
    whole = call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Paris"}')
    reply = whole + cut_after + 'ther", "arguments": {"city": "Oslo"}}\n</tool_call>'
    body = {"messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": len(whole + cut_after)}
    with running_server(_config(reply), ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json=body, timeout=30)
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
        assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"city": "Paris"}]
        chunks = list(_client(s).chat.completions.create(model="fake", stream=True, **body))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_a_stop_string_inside_constrained_text_does_not_cut_it_but_still_cuts_free_text():
    # The stop strings occur inside the JSON of a schema reply and inside a call's arguments;
    # matched there, they would cut each into text that does not parse (it was a 500 "not JSON").
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    with running_server(_config('{"a": "x}y", "b": [1]}'), ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "response_format": fmt,
                                                          "stop": ["}", "]"], "max_tokens": 60}, timeout=30)
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", r.json()
        assert json.loads(choice["message"]["content"]) == {"a": "x}y", "b": [1]}
        # Free text (no grammar) is still cut at the first stop string.
        plain = httpx.post(s.base + "/chat/completions", json={"messages": USER, "stop": ["}"],
                                                              "max_tokens": 60}, timeout=30)
        assert plain.json()["choices"][0]["message"]["content"] == '{"a": "x'
    with running_server(_config(REPLY), ServeOptions(model_name="fake")) as s:
        body = {"messages": USER, "tools": TOOLS, "stop": ["Paris", "check"], "max_tokens": 200}
        choice = httpx.post(s.base + "/chat/completions", json=body, timeout=30).json()["choices"][0]
        # "check" comes before the call opens: free text, cut there, and no call follows.
        assert choice["message"]["content"] == "Let me " and choice["finish_reason"] == "stop", choice
        body["stop"] = ["Paris"]  # only inside the call's arguments: the call comes whole
        choice = httpx.post(s.base + "/chat/completions", json=body, timeout=30).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
