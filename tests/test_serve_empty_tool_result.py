"""A tool that answers nothing (a command that printed nothing; an Agents SDK tool returning "")
is a result the model reads, not an empty conversation: the call that sends it back is answered."""

from __future__ import annotations

import httpx
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

TOOLS = [{"type": "function", "function": {"name": "touch", "description": "make a file",
                                           "parameters": {"type": "object", "properties": {}}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "touch", "arguments": "{}"}}


@pytest.mark.parametrize("content", ["", None, "   "])
def test_an_empty_tool_result_as_the_last_message_is_answered(content):
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=4, reply="done"), policy="fixed:64")
    messages = [{"role": "user", "content": "make the file"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": content}]
    with running_server(config, ServeOptions(model_name="fake")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": messages, "tools": TOOLS, "max_tokens": 8},
                       timeout=30)
        empty_user = httpx.post(s.base + "/chat/completions",
                                json={"messages": [{"role": "user", "content": " "}], "max_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    assert empty_user.status_code == 400  # a person's empty message is still refused
