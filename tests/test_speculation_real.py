"""Speculation on the real model (CPU): at temperature 0 the replies are token for token those of
generation without drafts, for repetitive prompts and open ones, several sequences in one batch."""

from __future__ import annotations

import numpy as np
import pytest

from backend.protocol import DecodeOutcome
from magnitude_tui.engine.core import Engine
from scheduler.types import BatchPlan, Message, Request, SamplingParams, SeqSlice

pytestmark = pytest.mark.slow

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
"""
PROMPTS = {
    "rewrite": f"Rewrite this code with subtotal renamed to base_amount:\n{CODE}",
    "repeat": "Repeat this line three times: the cat sat on the mat and looked at the hat.",
    "quote": "Quote the first sentence exactly: 'It was a bright cold day in April, and the clocks "
             "were striking thirteen.' Then explain it.",
    "open": "Write a short poem about the sea.",
}
# A greedy choice whose top two logits are closer than this is a near-tie: llama.cpp's sums depend
# on the batch's shape and on which KV cells hold the context, so a verification batch of 1 + k rows
# (and the cells left free by rejected drafts) may flip it, as any other change of batching may.
NEAR_TIE = 0.5


def run_tokens(backend, mode: str, *, seeded: bool = False,
               policy: str = "target:50") -> tuple[dict[str, list[int]], int]:
    """The reply tokens of every prompt (submitted together) and the draft tokens accepted."""
    engine = Engine(backend, spec=mode, policy=policy)
    sampling = (SamplingParams(temperature=0.8, seed=7, max_tokens=32) if seeded
                else SamplingParams(max_tokens=32))
    seqs = {}
    for name, text in PROMPTS.items():
        engine.submit(Request(name, name, (Message("user", text),), sampling))
    accepted = 0
    while engine.has_work():
        report = engine.step()
        if report is not None:
            accepted += report.draft_accepted
            assert engine.scheduler.kv.mismatches() == []
        for seq in engine.scheduler.running:  # the same objects keep growing until they end
            seqs[seq.request_id] = seq
    out = {name: list(seq.output) for name, seq in seqs.items()}
    for name in PROMPTS:
        engine.close_session(name)
    engine.run_until_idle()
    assert engine.is_empty(), engine.leaks()
    return out, accepted


def margin_at(backend, prompt: list[int], prefix: list[int]) -> float:
    """Top-1 minus top-2 logit of the greedy choice after `prompt + prefix`, evaluated alone."""
    tokens = prompt + prefix
    result = backend.decode(BatchPlan(0, (SeqSlice(15, 0, tuple(tokens), True, False),), len(tokens)))
    assert result.outcome is DecodeOutcome.OK
    row = np.array(backend.logits(result.logit_rows[15]))
    backend.kv_remove(15)
    a, b = np.sort(row)[-2:][::-1]
    return float(a - b)


_OFF: dict[bool, dict[str, list[int]]] = {}


def without_drafts(backend, seeded: bool = False) -> dict[str, list[int]]:
    """The replies with --spec off (run once per module: every mode compares with the same)."""
    if seeded not in _OFF:
        _OFF[seeded], accepted = run_tokens(backend, "off", seeded=seeded)
        assert accepted == 0
    return _OFF[seeded]


@pytest.mark.parametrize("mode", ["ngram", "auto"])
def test_greedy_replies_are_those_without_speculation(clean_llama, mode):
    off = without_drafts(clean_llama)
    on, accepted = run_tokens(clean_llama, mode)
    assert accepted > 0  # drafts were verified, and some accepted
    identical = 0
    for name in PROMPTS:
        if on[name] == off[name]:
            identical += 1
            continue
        # Seen here: "quote" at token 28 and "open" at token 7, top-2 margins 0.047 and 0.045.
        # Only a near-tie may flip, and only at the first difference: measure it there.
        i = next(j for j, (x, y) in enumerate(zip(on[name], off[name])) if x != y)
        prompt = clean_llama.tokenize_chat([Message("user", PROMPTS[name])])
        margin = margin_at(clean_llama, prompt, off[name][:i])
        assert margin < NEAR_TIE, f"{name}: token {i} differs with a top-2 margin of {margin:.3f}"
    assert identical >= 1


def test_seeded_sampling_with_drafts_is_reproducible_and_starts_as_without(clean_llama):
    # Each verified row is sampled in order with the sequence's own chain, one draw per token, as
    # without drafts. Yet seeded replies part from those without drafts (here: 3 of 4, at tokens
    # 3, 10 and 24): either the verification batch's slightly different sums move a draw across
    # a boundary, or the draws are not consumed in the same order; not established yet (see
    # docs/design/speculation.md). What holds: with the batches fixed (fixed:512, forced ngram)
    # the same seed gives the same replies again, and every reply's first token (drawn from the
    # prompt's row, before any draft) is the one drawn without drafts.
    off, _ = run_tokens(clean_llama, "off", seeded=True, policy="fixed:512")
    on, accepted = run_tokens(clean_llama, "ngram", seeded=True, policy="fixed:512")
    again, _ = run_tokens(clean_llama, "ngram", seeded=True, policy="fixed:512")
    assert accepted > 0
    assert again == on
    assert all(on[name][0] == off[name][0] for name in PROMPTS), (on, off)
    print(f"\nseeded replies equal to --spec off's: {sum(on[n] == off[n] for n in PROMPTS)} of {len(PROMPTS)}")
