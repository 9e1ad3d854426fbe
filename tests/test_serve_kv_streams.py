"""`serve --kv-streams` on the real model through the official openai client: a stream per sequence
holds its share of the context, forks copy their parent's cells, and a prompt over the share is
refused alone."""

from __future__ import annotations

import openai
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client():
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=2048, n_seq_max=2, n_batch=512, n_threads=1,
                                        kv_streams=True), policy="target:50")
    with running_server(config, ServeOptions(model_name="smollm2")) as s:
        yield openai.OpenAI(base_url=s.base, api_key="unused", max_retries=0, timeout=120)


def test_conversations_and_forks_are_answered_on_their_own_streams(client):
    a = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0, user="a")
    again = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0, user="a")
    assert a.choices[0].message.content and again.choices[0].message.content == a.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    # Two choices of one prompt: the second forks the first's prompt cells into another stream.
    many = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=12, temperature=0.9,
                                          seed=3, n=2, user="b")
    assert len(many.choices) == 2 and all(c.message.content for c in many.choices)


def test_a_prompt_over_a_streams_share_is_refused_and_the_next_call_is_answered(client):
    # About 1,300 tokens: under the 2,048 cells of the context, over the 1,024 of one stream.
    long = [{"role": "user", "content": "the lamp was lit again " * 260}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="smollm2", messages=long, max_tokens=8, user="c")
    assert refused.value.code == "context_length_exceeded" and "a sequence holds 1,016" in str(refused.value)
    ok = client.chat.completions.create(model="smollm2", messages=QUESTION, max_tokens=8, temperature=0, user="c")
    assert ok.choices[0].message.content
