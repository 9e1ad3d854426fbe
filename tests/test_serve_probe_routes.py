"""The openai client's models.retrieve(), and an unexpected failure answered in the OpenAI shape."""

from __future__ import annotations

import httpx
import openai
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(BackendConfig("fake", n_ctx=2048, n_seq_max=4, reply="hello there"), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="org/fake-1")) as s:
        yield s


def test_models_retrieve_answers_the_served_model_and_404s_another(server):
    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=30)
    m = client.models.retrieve("org/fake-1")  # was a 404 "Not Found (GET /v1/models/...)"
    assert m.id == "org/fake-1" and m.object == "model"
    assert [x.id for x in client.models.list()] == ["org/fake-1"]
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found" and "gpt-4o" in e.value.body["message"]


def test_an_unexpected_failure_is_a_500_in_the_openai_shape_and_the_server_goes_on(server):
    session_for = server.hub.session_for

    def broken(name: str) -> str:
        if name == "breaks":
            raise RuntimeError("a bug with /secret/path in its words")
        return session_for(name)

    server.hub.session_for = broken  # type: ignore[method-assign]
    try:
        with httpx.Client(base_url=server.base, timeout=30) as c:
            r = c.post("/chat/completions", json={"messages": USER, "user": "breaks", "max_tokens": 4})
            assert r.status_code == 500
            err = r.json()["error"]  # was Starlette's bare text "Internal Server Error"
            assert err["type"] == "server_error" and "secret" not in err["message"]
            ok = httpx.post(server.base + "/chat/completions", json={"messages": USER, "max_tokens": 4}, timeout=30)
            assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "hell"
    finally:
        del server.hub.session_for
