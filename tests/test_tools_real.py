"""Tool calls and structured output on the real default model, through `serve` and the official clients."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Annotated

import jsonschema
import openai
import pytest
from pydantic import Field

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

pytestmark = pytest.mark.slow

PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0}}}


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=4096, n_seq_max=8, n_batch=512),
                          policy="target:50")
    with running_server(config, ServeOptions(model_name="smollm2")) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)


def _round_trip(client, first, prompt_tokens: int) -> None:
    """The call's arguments validate; its result goes back; the model answers in text."""
    assert first.finish_reason == "tool_calls"
    call = first.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    history = ASK + [first.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C."}]
    final = client.chat.completions.create(model="smollm2", messages=history, tools=TOOLS, tool_choice="none",
                                           max_tokens=40, temperature=0)
    assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    # The history up to the call is reused from the cache: the call is rendered as the model wrote
    # it (only where the model's own tokens differ from a fresh tokenization of the same text, and
    # after it, is anything evaluated again).
    assert final.usage.prompt_tokens_details.cached_tokens >= prompt_tokens, final.usage


def test_required_tool_round_trip(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=60, temperature=0)
    _round_trip(client, r.choices[0], r.usage.prompt_tokens)


def test_required_tool_round_trip_streamed(client):
    stream = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
                                            parallel_tool_calls=False, max_tokens=60, temperature=0.7, seed=5,
                                            stream=True, stream_options={"include_usage": True})
    usage = None
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        for tc in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
            c["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0]
    message = openai.types.chat.ChatCompletionMessage(
        role="assistant", content=None,
        tool_calls=[{"id": calls[0]["id"], "type": "function",
                     "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}])
    _round_trip(client, openai.types.chat.chat_completion.Choice(index=0, finish_reason="tool_calls",
                                                                 message=message), usage.prompt_tokens)


def test_a_named_function_is_called_with_valid_arguments(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS, max_tokens=60, seed=2,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    (call,) = r.choices[0].message.tool_calls[:1]
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    assert r.model_extra["timings"]["grammar_ms"] > 0


def test_json_schema_replies_validate_over_twenty_seeds(client):
    replies: dict[int, str] = {}

    def one(seed: int) -> None:
        r = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Invent a person."}], seed=seed,
            temperature=1.0, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                   "strict": True}})
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        replies[seed] = r.choices[0].message.content

    threads = [threading.Thread(target=one, args=(seed,)) for seed in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert sorted(replies) == list(range(20))
    for text in replies.values():
        jsonschema.validate(json.loads(text), PERSON)


def test_json_object_reply_parses(client):
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Describe a cat."}],
                                       response_format={"type": "json_object"}, max_tokens=80, seed=4)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still the start of a JSON object, never prose
        assert r.choices[0].message.content.lstrip().startswith("{")


def test_the_openai_agents_sdk_runs_an_agent_with_a_function_tool(server):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # traces would go to OpenAI's servers: nothing leaves this machine
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return f"Sunny in {city}, 21 C."

    model = OpenAIChatCompletionsModel(model="smollm2", openai_client=openai.AsyncOpenAI(
        base_url=server.base, api_key="unused", max_retries=0, timeout=300))
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                                 temperature=0),
                  tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=3,
                                    run_config=RunConfig(tracing_disabled=True)))
    assert len(seen) == 1 and seen[0]
    assert result.final_output == f"Sunny in {seen[0]}, 21 C."


def test_tools_with_a_response_format_reply_with_calls_or_json_of_the_schema(client):
    # Calls, or (when the reply calls nothing) JSON of the schema: OpenAI takes both together, and
    # the Agents SDK sends both for an agent with tools and an output_type. They were a 400.
    # Sampled replies may still be cut by max_tokens; never are they free text.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for seed, ask in enumerate([ASK, [{"role": "user", "content": "Invent a person."}]] * 3):
        r = client.chat.completions.create(model="smollm2", messages=ask, tools=TOOLS, response_format=fmt,
                                           max_tokens=120, temperature=1.0, seed=seed, parallel_tool_calls=False)
        choice = r.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason in ("tool_calls", "length"), choice
            if choice.finish_reason == "tool_calls":
                jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), PARAMS)
        else:
            assert choice.message.content.lstrip().startswith("{"), choice
            if choice.finish_reason == "stop":
                jsonschema.validate(json.loads(choice.message.content), PERSON)


def test_the_openai_agents_sdk_runs_an_agent_with_tools_and_a_structured_output(server):
    # The SDK sends `tools` and a `response_format` schema together for such an agent: that was a
    # 400 on the first call. Greedy SmolLM2 then calls its tool every turn (it never settles on
    # an answer), so what is checked is that each call is taken and answered with a valid call,
    # or ends the run with the structured output.
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
    from agents.exceptions import MaxTurnsExceeded
    from pydantic import BaseModel

    class Person(BaseModel):  # bounded strings: greedy SmolLM2 otherwise writes a name until max_tokens
        name: str = Field(max_length=16)
        age: int

    seen: list[str] = []

    @function_tool
    def lookup(name: Annotated[str, Field(max_length=16)]) -> str:
        """Facts about a person."""
        seen.append(name)
        return f"{name} is 30 years old."

    model = OpenAIChatCompletionsModel(model="smollm2", openai_client=openai.AsyncOpenAI(
        base_url=server.base, api_key="unused", max_retries=0, timeout=300))
    agent = Agent(name="people", instructions="Answer about a person.", tools=[lookup], model=model,
                  output_type=Person, model_settings=ModelSettings(max_tokens=200, temperature=0,
                                                                   parallel_tool_calls=False))
    try:
        result = asyncio.run(Runner.run(agent, "Who is Ada?", max_turns=3, run_config=RunConfig(tracing_disabled=True)))
    except MaxTurnsExceeded:
        assert len(seen) >= 2 and all(seen)  # three calls taken, each answered with a valid call
    else:
        assert isinstance(result.final_output, Person)
