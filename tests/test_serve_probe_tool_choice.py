"""tool_choice naming a function gets exactly one call of it (OpenAI's forced function: "call
exactly one specific function"); `parallel_tool_calls: null` is the default, as null is for every field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.tools_body import parse_tool_use
from tests.serve_support import running_server

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "time",
                                      "parameters": {"type": "object", "properties": {}}}}]
USER = [{"role": "user", "content": "What's the weather in Paris? Use the tool."}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize("parallel", [None, True, False])
def test_a_named_tool_choice_asks_the_engine_for_one_call(parallel):
    body = {"tools": TOOLS, "tool_choice": NAMED} | ({} if parallel is None else {"parallel_tool_calls": parallel})
    assert parse_tool_use(body).parallel_tool_calls is False
    assert parse_tool_use(body | {"tool_choice": "required"}).parallel_tool_calls is (parallel is not False)


def test_parallel_tool_calls_null_is_the_default():
    # It was a 400 "'parallel_tool_calls' must be true or false"; every other field takes null.
    two = (call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Paris"}') + "\n"
           + call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Oslo"}'))
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=4, reply=two), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "tools": TOOLS, "tool_choice": "required",
                                                          "parallel_tool_calls": None, "max_tokens": 300}, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 2


@pytest.mark.slow
def test_a_named_tool_choice_gets_one_call_on_the_real_model():
    # Greedy SmolLM2 on this prompt called get_weather twice under the named choice.
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=2048, n_seq_max=2, n_threads=1),
                          policy="target:50")
    with running_server(config, ServeOptions(model_name="smollm2")) as s:
        client = openai.OpenAI(base_url=s.base, api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="smollm2", messages=USER, tools=TOOLS, tool_choice=NAMED,
                                           max_tokens=60, temperature=0)
        chunks = list(client.chat.completions.create(model="smollm2", messages=USER, tools=TOOLS, tool_choice=NAMED,
                                                     max_tokens=60, temperature=0, stream=True))
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)
    ids = [tc.id for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or [] if tc.id]
    assert len(ids) == 1
