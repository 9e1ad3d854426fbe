"""POST /v1/completions over the fake backend, driven by the official openai client: text_completion
shapes, streaming, n, stop, usage and timings, and the refusals."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

import backend.fake
from backend.factory import BackendConfig
from backend.fake import DEFAULT_REPLY, FakeBackend
from backend.template_fallback import INFO_NOTICE
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.text_completion import DEFAULT_MAX_TOKENS
from tests.serve_support import running_server, wait_until

FAKE = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64")
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server():
    with running_server(FAKE, ServeOptions(model_name="fake-model", max_live=12)) as s:
        yield s


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=30)


def _expected(n: int) -> str:
    return (DEFAULT_REPLY * (n // len(DEFAULT_REPLY) + 1))[:n]


def test_a_prompt_is_completed_as_text_with_usage(server):
    r = _client(server).completions.create(model="fake-model", prompt=PROMPT, max_tokens=20)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert [(c.index, c.text, c.finish_reason) for c in r.choices] == [(0, _expected(20), "length")]
    # BOS and one fake token per character: no chat template's scaffolding around it.
    assert r.usage.prompt_tokens == 1 + len(PROMPT)
    assert r.usage.completion_tokens == 20 and r.usage.total_tokens == 21 + len(PROMPT)


def test_max_tokens_defaults_to_openais_16(server):
    r = _client(server).completions.create(model="fake-model", prompt="Go on:")
    assert r.choices[0].text == _expected(DEFAULT_MAX_TOKENS) and r.usage.completion_tokens == 16


def test_a_stop_string_ends_the_text_before_it(server):
    r = _client(server).completions.create(model="fake-model", prompt=PROMPT, max_tokens=40, stop=["fox", "zzz"])
    assert r.choices[0].text == "The quick brown " and r.choices[0].finish_reason == "stop"


def test_streamed_chunks_are_text_completions_and_usage_comes_last(server):
    stream = _client(server).completions.create(model="fake-model", prompt=PROMPT, max_tokens=12, stream=True,
                                                stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == _expected(12)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_n_choices_fork_one_prompt_streamed_or_not(server):
    client = _client(server)
    r = client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=10, n=2, temperature=0.7,
                                  top_p=0.9, seed=3)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.text == _expected(10) and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 20 and r.usage.prompt_tokens == 1 + len(PROMPT)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(model="fake-model", prompt=PROMPT, max_tokens=10, n=2, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == {0: _expected(10), 1: _expected(10)}


def test_timings_come_with_the_answer_and_the_last_chunk(server):
    r = httpx.post(server.base + "/completions", json={"prompt": PROMPT, "max_tokens": 8}, timeout=30)
    assert r.status_code == 200, r.text
    t = r.json()["timings"]
    assert t["predicted_n"] == 8 and t["prompt_n"] + t["cache_n"] == 1 + len(PROMPT)
    for key in ("prompt_ms", "predicted_ms", "queue_ms", "ttft_ms", "phases_ms"):
        assert key in t
    events = []
    with httpx.stream("POST", server.base + "/completions", timeout=30,
                      json={"prompt": PROMPT, "max_tokens": 5, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length" and last["timings"]["predicted_n"] == 5


def test_a_prompt_of_token_ids_is_taken_as_is(server):
    ids = [ord(ch) for ch in "Hello"]
    r = _client(server).completions.create(model="fake-model", prompt=ids, max_tokens=4)
    assert r.usage.prompt_tokens == len(ids) and r.choices[0].text == _expected(4)


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["one", "two"]}, "prompt"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "n": 99}, "n"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": [70000]}, "prompt"),  # outside the fake's vocabulary (refused by the engine)
])
def test_a_bad_body_is_refused_with_the_field_named(server, body, param):
    r = httpx.post(server.base + "/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    wait_until(lambda: server.hub.num_live == 0)



class _BaseModelFake(FakeBackend):
    """The fake as a model without a chat template (serve's worker builds it by this name)."""

    def __init__(self, **sizes) -> None:
        super().__init__(base_model=True, **sizes)


def test_serve_logs_a_missing_chat_template_at_load(monkeypatch):
    monkeypatch.setattr(backend.fake, "FakeBackend", _BaseModelFake)
    with running_server(FAKE, ServeOptions(model_name="base")) as s:
        notice = _BaseModelFake().info[INFO_NOTICE]
        assert f"[serve] {notice}" in s.log.getvalue().splitlines()
        # A chat reply on it is ChatML-rendered as text: the prompt counts the markers' characters.
        r = openai.OpenAI(base_url=s.base, api_key="unused", max_retries=0).chat.completions.create(
            model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert r.usage.prompt_tokens == len("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
