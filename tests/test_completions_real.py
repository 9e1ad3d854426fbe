"""POST /v1/completions on the real model, driven by the official openai client."""

from __future__ import annotations

import openai
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.needs import need_real_model
from tests.serve_support import running_server

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # cold vs warm replies: auto speculation and threads follow timings

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def client():
    need_real_model()
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=2048, n_seq_max=4, n_batch=512,
                                        flash_attn="off"), policy="target:50")
    with running_server(config, ServeOptions(model_name="smollm2")) as s:
        yield openai.OpenAI(base_url=s.base, api_key="unused", max_retries=0, timeout=120)


def test_a_prompt_is_continued_streamed_or_not_with_n_and_stop(client):
    whole = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=12, temperature=0)
    text = whole.choices[0].text
    assert text.strip() and whole.choices[0].finish_reason in ("length", "stop")
    assert whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens >= 5
    streamed = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=12, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text
    word = next(w for w in text.split() if len(w) > 2)
    cut = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=12, temperature=0, stop=[word])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[:text.index(word)]
    two = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=6, n=2, temperature=0.8, seed=5)
    assert [c.index for c in two.choices] == [0, 1] and all(c.text for c in two.choices)
