"""Other model families than SmolLM2 through the engine: a tiny random Qwen2 (attention biases,
no window) serves turns, forks and edits as cold runs; a Gemma chat template, which raises on a
system message, gets the system prompt at the start of the first user message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from magnitude_tui.engine.core import Engine
from scheduler.types import Message
from tests.arch_gguf import arch_model
from tests.engine_driver import Driver, close_and_assert_empty
from tests.needs import need_real_model

# Gemma 2's chat template as its GGUFs carry it.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
TOKENS = [int(t) for t in np.random.default_rng(3).integers(100, 40000, 300)]


def load(path: Path):
    from backend.llama_backend import LlamaBackend

    return LlamaBackend.load(model_path=str(path), device="cpu", n_ctx=1024, n_seq_max=4, n_batch=256,
                             n_ubatch=64, n_threads=1, flash_attn="off")


@pytest.fixture(scope="module")
def source():
    need_real_model()
    from backend.llama_load import default_model_path

    return Path(default_model_path())


def run(d: Driver, rid: str, session: str, fork_from: str | None = None, **what) -> str:
    d.submit(rid, session, max_tokens=10, fork_from=fork_from, **what)
    d.run_until_done(rid)
    assert d.seen[rid].last.error is None, d.seen[rid].last.error
    return d.seen[rid].text


def test_a_qwen2_model_serves_turns_forks_and_edits_as_cold_runs(source, tmp_path):
    b = load(arch_model(tmp_path / "qwen2.gguf", source, arch="qwen2"))
    try:
        assert b.n_swa == 0 and "sliding_window" not in b.info
        d = Driver(Engine(b, policy="fixed:64", coalesce_ms=0.0))
        prompts = {"turn": TOKENS[:250], "fork": TOKENS[:280], "edit": TOKENS[:40] + [21, 22]}
        run(d, "t1", "a", prompt_tokens=TOKENS[:200])
        got = {"turn": run(d, "t2", "a", prompt_tokens=prompts["turn"])}
        got["fork"] = run(d, "f1", "child", fork_from="a", prompt_tokens=prompts["fork"])
        assert d.seen["f1"].last.cached_tokens == 250
        got["edit"] = run(d, "t3", "a", prompt_tokens=prompts["edit"])
        assert d.seen["t3"].last.cached_tokens == 40
        close_and_assert_empty(d.engine, "a", "child")
        for name, prompt in prompts.items():
            assert run(d, f"cold-{name}", f"cold-{name}", prompt_tokens=prompt) == got[name], name
            close_and_assert_empty(d.engine, f"cold-{name}")
    finally:
        b.close()


def test_a_gemma_template_takes_the_system_prompt_into_the_first_user_message(source, tmp_path):
    """Before: every request with a system prompt (an agent's role, a serve caller's) ended with
    'could not prepare the prompt: System role not supported'."""
    b = load(arch_model(tmp_path / "gemma2.gguf", source, template=GEMMA_TEMPLATE))
    try:
        assert not b.vocab.system_role
        system, user = Message("system", "Answer in one word."), Message("user", "Which colour is the sky?")
        folded = b.tokenize_chat([Message("user", "Answer in one word.\n\nWhich colour is the sky?")])
        assert b.tokenize_chat([system, user]) == folded
        assert "".join(map(b.vocab.token_text, folded)).count("<start_of_turn>") == 2  # user, model
        d = Driver(Engine(b, policy="fixed:64", coalesce_ms=0.0))
        d.submit("r1", "s1", [system, user], max_tokens=4)
        d.run_until_done("r1")
        assert d.seen["r1"].last.error is None
        close_and_assert_empty(d.engine, "s1")
    finally:
        b.close()


def test_a_template_with_a_system_role_keeps_it(source, tmp_path):
    b = load(arch_model(tmp_path / "gemma2.gguf", source))  # SmolLM2's ChatML template
    try:
        assert b.vocab.system_role
        as_system = b.tokenize_chat([Message("system", "Be brief."), Message("user", "Hi")])
        assert as_system != b.tokenize_chat([Message("user", "Be brief.\n\nHi")])
    finally:
        b.close()
