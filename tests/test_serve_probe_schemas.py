"""Schemas as real clients generate them (the openai client's Pydantic schemas, zod's): local
`$ref`s beside a `$schema` URL or a link in a description are followed, only references that
point outside the schema are refused at the door."""

from __future__ import annotations

import json

import httpx
import pytest

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

USER = [{"role": "user", "content": "A person, please."}]
# What zod-to-json-schema writes: a draft-07 `$schema` URL and local definitions.
ZOD = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
       "properties": {"city": {"$ref": "#/definitions/City"}}, "required": ["city"],
       "definitions": {"City": {"type": "string", "description": "a city, see https://example.com/cities"}}}


def _server(reply: str):
    return running_server(EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=4, reply=reply),
                                       policy="fixed:64"), ServeOptions(model_name="fake"))


def test_a_schema_with_a_schema_url_and_local_refs_is_followed_in_response_format():
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": ZOD}}
    with _server('{"city": "Paris"}') as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "response_format": fmt,
                                                          "max_tokens": 40}, timeout=30)
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"city": "Paris"}


def test_a_tool_whose_parameters_quote_a_link_beside_local_refs_is_called():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": ZOD}}]
    with _server(call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Paris"}')) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "tools": tools,
                                                          "tool_choice": "required", "max_tokens": 100}, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("ref", ["https://example.com/person.json", "person.json#/definitions/A"])
def test_a_ref_outside_the_schema_is_refused_naming_the_parameter(ref):
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    with _server("{}") as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": USER, "response_format": fmt}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema" and ref in err["message"]
