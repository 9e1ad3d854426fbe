"""A schema whose grammar is too slow to sample is the caller's fault: a 400 naming the parameter it
came from, however many tokens were written, and the same error object inside a stream."""

from __future__ import annotations

import json

import httpx
import pytest

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]
REPLY = '{"a": "' + "x" * 60 + '"}'


@pytest.fixture
def slow_on_average(monkeypatch):
    """Every grammar counts as slow on average: a request fails after its first few tokens."""
    import magnitude_tui.engine.sampling as sampling

    monkeypatch.setattr(sampling, "MAX_MEAN_MASK_MS", -1.0)
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=8, reply=REPLY), policy="fixed:2")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        yield s


def test_a_grammar_slow_on_average_is_a_400_naming_response_format_after_tokens_were_written(slow_on_average):
    # The mean limit fires once MEAN_AFTER_TOKENS tokens were written: a whole reply answered that
    # as a 500 generation_failed, where the one-token limit (nothing written) answered a 400.
    for n in (1, 2):
        r = httpx.post(slow_on_average.base + "/chat/completions", timeout=60, json={
            "messages": USER, "max_tokens": 40, "n": n, "response_format": SCHEMA})
        assert r.status_code == 400, (n, r.text)
        error = r.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error", "invalid_request", "response_format"), error
        assert "on average" in error["message"] and "simplify the schema" in error["message"]


def test_a_stream_that_already_sent_chunks_ends_with_the_same_error_object(slow_on_average):
    # The stream's in-band error said server_error / generation_failed with no param, for what a
    # whole reply answers as the caller's invalid_request naming response_format.
    with httpx.stream("POST", slow_on_average.base + "/chat/completions", timeout=60, json={
            "messages": USER, "max_tokens": 40, "stream": True, "response_format": SCHEMA}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text and REPLY.startswith(text)  # chunks went out before the limit fired
    (error,) = [e["error"] for e in events if "error" in e]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "invalid_request", "response_format"), error
    assert "on average" in error["message"]


@pytest.mark.parametrize("choice, start, param", [
    ("required", "tools: ", "tools"),  # the calls' grammar alone: the schema plays no part
    ("auto", "tools and response_format: ", "tools"),  # one grammar of both
])
def test_a_slow_grammar_from_tools_beside_a_response_format_names_the_tools(monkeypatch, choice, start, param):
    import magnitude_tui.engine.sampling as sampling

    monkeypatch.setattr(sampling, "MAX_MASK_MS", -1.0)  # every mask counts as too slow
    reply = call_text(ToolSyntax.GENERIC, "lookup", '{"q": "x"}')
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=8, reply=reply), policy="fixed:2")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", timeout=60, json={
            "messages": USER, "max_tokens": 40, "tools": TOOLS, "tool_choice": choice, "response_format": SCHEMA})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"].startswith(start) and error["param"] == param, error
