"""Speculation on the real model (CPU): at temperature 0 the replies are token for token those of
generation without drafts, for repetitive prompts and open ones, several sequences in one batch."""

from __future__ import annotations

import numpy as np
import pytest

from backend.protocol import DecodeOutcome
from magnitude_tui.engine.core import Engine
from scheduler.types import BatchPlan, Message, Request, SamplingParams, SeqSlice
from tests.needs import need_real_model

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


def run_tokens(backend, mode: str, *, seeded: bool = False, policy: str = "target:50",
               prompts: dict[str, str] = PROMPTS) -> tuple[dict[str, list[int]], int]:
    """The reply tokens of every prompt (submitted together) and the draft tokens accepted."""
    engine = Engine(backend, spec=mode, policy=policy)
    sampling = (SamplingParams(temperature=0.8, seed=7, max_tokens=32) if seeded
                else SamplingParams(max_tokens=32))
    seqs = {}
    for name, text in prompts.items():
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
    for name in prompts:
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


@pytest.mark.serial
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
    # without drafts; on row-invariant kernels seeded replies are exactly those without drafts
    # (test_one_sequence_on_row_invariant_kernels_...). Here, on the default kernels, a verification
    # row's logits differ by up to ~0.8 from a one-row step's, enough to move a draw at temperature
    # 0.8 (seen: 3 of 4 replies part at tokens 3, 10, 24), and with several sequences rejected
    # drafts leave cells that change the order attention sums a sequence's context. What holds
    # here: with the batches fixed (fixed:512, forced ngram) the same seed gives the same replies
    # again, and every reply's first token (drawn from the prompt's row, before any draft) is the
    # one drawn without drafts.
    off, _ = run_tokens(clean_llama, "off", seeded=True, policy="fixed:512")
    on, accepted = run_tokens(clean_llama, "ngram", seeded=True, policy="fixed:512")
    again, _ = run_tokens(clean_llama, "ngram", seeded=True, policy="fixed:512")
    assert accepted > 0
    assert again == on
    assert all(on[name][0] == off[name][0] for name in PROMPTS), (on, off)
    print(f"\nseeded replies equal to --spec off's: {sum(on[n] == off[n] for n in PROMPTS)} of {len(PROMPTS)}")


@pytest.fixture(scope="module")
def row_invariant():
    """The real model on kernels that compute a row alike in a batch of 1 or of k rows: flash
    attention on one thread. Dense attention computes a single row with other kernels than two or
    more (llama.cpp's CPU matrix multiply takes its tiled path only from 2 rows), and flash attention
    on several threads splits a single row's cells between them from 512 cells on; both move the
    logits of a decode row by up to ~0.8 against the same row verified beside drafts."""
    need_real_model()
    from backend.llama_backend import LlamaBackend

    backend = LlamaBackend.load(device="cpu", n_ctx=2048, n_seq_max=4, n_threads=1, flash_attn="on")
    yield backend
    backend.close()


def decode_rows(backend, prefix: list[int], rows: list[int], one_by_one: bool) -> list[np.ndarray]:
    """Logits of `rows` after `prefix` (seq 0): fed one row per decode, or as one verification
    (a decode row and len(rows) - 1 draft rows)."""
    backend.kv_remove(0)
    assert backend.decode(BatchPlan(0, (SeqSlice(0, 0, tuple(prefix), False, False),), len(prefix))).outcome \
        is DecodeOutcome.OK
    out = []
    if one_by_one:
        for i, token in enumerate(rows):
            r = backend.decode(BatchPlan(0, (SeqSlice(0, len(prefix) + i, (token,), True, True),), 1))
            out.append(np.array(backend.logits(r.logit_rows[0])))
    else:
        r = backend.decode(BatchPlan(0, (SeqSlice(0, len(prefix), tuple(rows), True, True,
                                                  n_draft=len(rows) - 1),), len(rows)))
        out = [np.array(backend.logits(i)) for i in (r.logit_rows[0], *r.draft_rows[0])]
    backend.kv_remove(0)
    return out


def test_a_verified_row_has_the_logits_of_the_same_row_decoded_alone_on_row_invariant_kernels(row_invariant):
    # Where llama.cpp computes a row alike whatever the batch, a verification is exact: the
    # decode row and every draft row get the logits one-row steps give the same positions.
    tokens = row_invariant.tokenize_chat([Message("user", PROMPTS["rewrite"])])
    alone = decode_rows(row_invariant, tokens[:-8], tokens[-8:], one_by_one=True)
    batched = decode_rows(row_invariant, tokens[:-8], tokens[-8:], one_by_one=False)
    assert [float(np.max(np.abs(a - b))) for a, b in zip(alone, batched)] == [0.0] * 8


@pytest.mark.serial
@pytest.mark.parametrize("seeded", [False, True])
def test_one_sequence_on_row_invariant_kernels_gives_exactly_the_reply_without_drafts(row_invariant, seeded):
    # With the kernels out of the way, any difference would be the engine's: a draft row at the
    # wrong position, rejected rows left in the KV cache, a wrong logits row, the bonus token, the
    # lookup's state after a rejection, or (seeded) random draws spent on rejected rows. So the
    # replies must be exactly equal, greedy and seeded, in both modes that draft.
    names = ("repeat",) if seeded else ("rewrite", "repeat")  # seeded: "repeat" parted at token 10 on dense kernels
    for name in names:
        text = PROMPTS[name]
        one = {name: text}
        off, _ = run_tokens(row_invariant, "off", seeded=seeded, prompts=one)
        for mode in ("ngram", "auto"):
            on, accepted = run_tokens(row_invariant, mode, seeded=seeded, prompts=one)
            assert accepted > 0, (name, mode)
            assert on == off, (name, mode, on, off)
