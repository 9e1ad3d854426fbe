"""`tools` with a `response_format` schema (the Agents SDK's agent with tools and an output_type):
the reply is calls, or JSON of the schema when it calls nothing. It was a 400."""

from __future__ import annotations

import json

import httpx
import pytest

from backend.factory import BackendConfig
from backend.grammar import reply_constraint
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.tools_body import parse_tool_use
from scheduler.types import Message, Request, SamplingParams
from tests.serve_support import running_server

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "facts",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
ASK = [{"role": "user", "content": "who is Ada?"}]


def _call(reply: str, **extra) -> httpx.Response:
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=4, reply=reply), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        return httpx.post(s.base + "/chat/completions", timeout=30, json={
            "messages": ASK, "tools": TOOLS, "response_format": FORMAT, "max_tokens": 200, **extra})


def test_a_reply_that_calls_a_tool_ends_with_tool_calls():
    r = _call(call_text(ToolSyntax.GENERIC, "lookup", '{"q": "Ada"}'))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"q": "Ada"}


def test_a_reply_that_calls_nothing_is_json_of_the_schema():
    r = _call('{"name": "Ada", "age": 36}')
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and json.loads(choice["message"]["content"]) == {"name": "Ada", "age": 36}
    # ... and one outside it fails as any response_format reply does (the fake backend ignores grammars)
    bad = _call('{"name": "Ada"}')
    assert bad.status_code == 500 and "age" in bad.json()["error"]["message"]


@pytest.mark.parametrize("choice, calls_only", [("auto", False), ("required", True), ("none", False)])
def test_the_grammar_takes_calls_or_the_schema_as_tool_choice_allows(choice, calls_only):
    use = parse_tool_use({"tools": TOOLS, "response_format": FORMAT, "tool_choice": choice})
    req = Request("r", "s", (Message("user", "x"),), SamplingParams(), tools=use.tools, tool_choice=use.tool_choice,
                  response_schema=use.response_schema)
    grammar = reply_constraint(req, ToolSyntax.GENERIC).grammar
    assert grammar is not None
    assert ("lookup" in grammar.gbnf) is (choice != "none")
    assert ("age-kv" in grammar.gbnf) is (not calls_only)


def test_a_tools_def_and_the_schemas_own_def_of_one_name_stay_two_rules():
    # The converter names a $ref's rule after its definition and reuses a rule of that name:
    # Pydantic puts nested models in $defs on both sides, and the answer got the tool's Item.
    item = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    answer_item = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"it": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": item}}}}]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"it": {"$ref": "#/$defs/Item"}}, "$defs": {"Item": answer_item},
        "required": ["it"]}}}
    use = parse_tool_use({"tools": tools, "response_format": fmt})
    req = Request("r", "s", (Message("user", "x"),), SamplingParams(), tools=use.tools, tool_choice=use.tool_choice,
                  response_schema=use.response_schema)
    rules = dict(line.split(" ::= ", 1) for line in reply_constraint(req, ToolSyntax.GENERIC).grammar.gbnf.splitlines())
    answer_rules = [r for name, r in rules.items() if name.startswith("answer")]
    assert any("label" in r for r in answer_rules) and not any("x-kv" in r for r in answer_rules)


def test_a_call_form_without_a_marker_refuses_tools_with_a_schema_under_auto():
    # Llama 3's calls are bare JSON: an answer {"name": "Bob", ...} would be read as a call to Bob.
    from backend.grammar import GrammarError

    use = parse_tool_use({"tools": TOOLS, "response_format": FORMAT})
    req = Request("r", "s", (Message("user", "x"),), SamplingParams(), tools=use.tools, tool_choice=use.tool_choice,
                  response_schema=use.response_schema)
    with pytest.raises(GrammarError, match="^response_format: this model writes its tool calls as bare JSON"):
        reply_constraint(req, ToolSyntax.LLAMA3)
    assert reply_constraint(req, ToolSyntax.HERMES).grammar is not None
