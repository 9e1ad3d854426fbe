"""Bodies that are valid JSON but not Unicode text: a `\\ud800` escape decodes to a lone surrogate,
which no tokenizer, log line or digest can encode. Each is a 400 in the OpenAI shape, and the
server answers the next call."""

from __future__ import annotations

import httpx
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

GOOD = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4'


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(BackendConfig("fake", n_ctx=2048, n_seq_max=4, reply="hello there"), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        yield s


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", GOOD + ', "user": "agent-\\ud800"}'),  # was a bare 500 (the session digest)
    ("/chat/completions", '{"messages": [{"role": "user", "content": "a \\udfff b"}]}'),
    ("/chat/completions", GOOD + ', "stop": ["\\ud800"]}'),
    ("/chat/completions", GOOD + ', "metadata": {"\\ud800": "key"}}'),
    ("/completions", '{"prompt": "x \\ud800", "max_tokens": 4}'),
])
def test_a_lone_surrogate_is_a_400_in_the_openai_shape_and_the_server_goes_on(server, path, body):
    with httpx.Client(base_url=server.base, timeout=30) as client:
        r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
        assert "surrogate" in err["message"]
        ok = client.post("/chat/completions", content=(GOOD + "}").encode(),
                         headers={"content-type": "application/json"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "hell"


def test_a_surrogate_pair_is_one_character_and_accepted(server):
    body = '{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "user": "\\ud83d\\ude00", "max_tokens": 4}'
    r = httpx.post(server.base + "/chat/completions", content=body.encode(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
