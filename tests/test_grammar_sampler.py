"""The greedy shortcut of the grammar sampler: the shortlists choose what the whole mask would."""

from __future__ import annotations

import json

import numpy as np
import pytest

from backend import grammar_sampler
from backend.grammar import schema_grammar
from tests.needs import need_real_model

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}}}
REPLY = '{"name":"Ada Lovelace","age":36}'


@pytest.fixture(scope="module")
def backend():
    need_real_model()
    from backend.llama_backend import LlamaBackend

    b = LlamaBackend.load(device="cpu", n_ctx=256, n_seq_max=1, n_threads=1, flash_attn="on")
    yield b
    b.close()


def rows(n_vocab: int, rng: np.random.Generator, opening: list[int]) -> list[np.ndarray]:
    """Logits of the shapes that matter: spread out; coarse, so ties abound (at a shortlist's
    edge too); flat; and ones where the tokens the grammar allows rank far down."""
    spread = rng.normal(0, 3, n_vocab).astype(np.float32)
    coarse = np.round(rng.normal(0, 1, n_vocab)).astype(np.float32)
    flat = np.zeros(n_vocab, dtype=np.float32)
    buried = rng.normal(0, 3, n_vocab).astype(np.float32)
    buried[opening] = -20.0  # what opens the reply ranks near the bottom
    return [spread, coarse, flat, buried]


def test_the_shortlists_choose_what_argmax_over_the_whole_mask_chooses(backend):
    grammar = schema_grammar(json.dumps(SCHEMA), "response_format")
    sampler = grammar_sampler.GrammarSampler(backend.vocab.native, grammar)
    tokens = backend.tokenize(REPLY)
    rng = np.random.default_rng(7)
    shortcut_taken = 0
    try:
        for step in range(len(tokens) + 1):  # every state of the grammar along a valid reply
            for logits in rows(backend.n_vocab, rng, tokens[:1]):
                whole = int(np.argmax(sampler.mask(logits)["logit"]))
                masks = 0
                real_mask = sampler.mask

                def counted(lg, _real=real_mask):
                    nonlocal masks
                    masks += 1
                    return _real(lg)

                sampler.mask = counted
                try:
                    assert sampler.best(logits) == whole, (step, REPLY)
                finally:
                    del sampler.mask
                shortcut_taken += masks == 0
            if step < len(tokens):
                assert sampler.allows(tokens[step])
                sampler.accept(tokens[step])
    finally:
        sampler.close()
    # The spread-out and buried rows are settled by the shortlists, not by the whole mask.
    assert shortcut_taken >= 2 * len(tokens)


@pytest.mark.parametrize("pattern, value", [
    (r"^(\d{1,3}\.){3}\d{1,3}$", "10.0.0.255"),  # `\d` and `\.` reached llama.cpp as is: it refused the grammar
    (r"^\d{4}-\d{2}-\d{2}$", "2026-12-04"),
    (r"^[\w.+-]+@[\w-]+\.[a-z]{2,}$", "ada.l+x@math-dept.uk"),
    (r"^\$\d+(\.\d{2})?\s\S+$", "$12.50 total"),
    # Escapes inside brackets: `\(` `\)` `\-` there are not llama.cpp's, and were refused.
    (r"^\+?[\d\s\(\)\-]{7,20}$", "+44 (20) 7946-0958"),
    # Repeats nested past the limit, but each group ends in a character found nowhere else in it
    # (a label's dot): one way to read any text, and a mask takes milliseconds, not seconds.
    (r"^([a-z0-9-]{1,63}\.){1,127}[a-z]{2,6}$", "mail.server-01.example.com"),
    (r"^((ab){1,20}c){1,100}$", "ababcabcababababc"),
])
def test_a_pattern_with_regex_escapes_compiles_and_takes_a_matching_reply(backend, pattern, value):
    grammar = schema_grammar(json.dumps({"type": "string", "pattern": pattern}), "response_format")
    sampler = grammar_sampler.GrammarSampler(backend.vocab.native, grammar)
    try:
        for token in backend.tokenize(json.dumps(value)):
            assert sampler.allows(token), (pattern, value)
            sampler.accept(token)
    finally:
        sampler.close()
