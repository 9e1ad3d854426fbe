"""The evidence behind a lookup guess: how long a verbatim match backs it, and the acceptance
estimates that condition on it, so a reply copying a block its prompt holds drafts as soon as its
latest tokens match the block at length, while guesses from a chance 2-gram still must earn rows."""

from __future__ import annotations

from backend.simulated import SimulatedBackend
from scheduler.budget import StepShape
from scheduler.cost_model import CostModel, CostParams
from scheduler.drafts import DraftKind, match_length
from scheduler.ngram import NgramIndex, NgramSource
from scheduler.row_price import MIN_PLAIN
from scheduler.sequence import Sequence
from scheduler.speculation import LONG_MATCH, SpecMode
from scheduler.speculator import Speculator
from scheduler.types import Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text

BLOCK = list(range(100, 130))  # a block of 30 tokens, no n-gram repeated inside it


def test_the_match_length_counts_the_verbatim_run_behind_a_guess_past_the_longest_ngram():
    ix = NgramIndex()
    ix.extend([50] + BLOCK + [99] + BLOCK[:10])  # the reply has copied the block's first 10 tokens
    assert ix.lookup(3) == BLOCK[10:13] and ix.match_length == 10  # 4-gram found, 10 agree
    ix.extend(BLOCK[10:13])  # the copy is followed: its run grows with what the reply copies
    assert ix.lookup(3) == BLOCK[13:16] and ix.match_length == 13
    ix.extend([77])  # broke: no suffix occurred before, no guess, no evidence
    assert ix.lookup(3) == [] and ix.match_length == 0
    chance = NgramIndex()
    chance.extend([1, 2, 3, 9, 1, 2])
    assert chance.lookup(2) == [3, 9] and chance.match_length == 2
    src = NgramSource()
    assert src.propose(0, [50] + BLOCK + [99] + BLOCK[:9], 4) == BLOCK[9:13]
    assert match_length(src, 0) == 9 and match_length(src, 1) == 0


CPU = CostModel(CostParams(fixed_ms=4.3, decode_ms=6.7, prefill_ms=6.7))  # the simulated 2-core CPU


def fresh_plan(prompt):
    """One sequence's first planning step on a fresh speculator (estimates at their priors)."""
    spec = Speculator({DraftKind.NGRAM: NgramSource()}, SpecMode.AUTO)
    seq = Sequence(Request("r", "s", (), SamplingParams(max_tokens=64)), prompt, t_submit=0.0)
    seq.seq_id, seq.num_computed = 0, len(prompt)
    out = spec.plan([seq], cost=CPU, shape=StepShape(decode_rows=1), prefill_rows=0, room_rows=512,
                    room_ms=None, n_ctx_seq=4096)
    return spec, seq, out


def test_a_guess_backed_by_a_long_match_drafts_from_the_first_step_and_a_chance_match_does_not():
    # At one sequence on the CPU a draft row costs 0.61 of the step: a fresh estimate (0.5) does
    # not pay; a guess that LONG_MATCH tokens back does, at its own estimate.
    spec, seq, out = fresh_plan([50] + BLOCK + [99] + BLOCK[:LONG_MATCH])
    kind, tokens = out[seq.seq_id]
    assert kind is DraftKind.NGRAM and tokens == tuple(BLOCK[LONG_MATCH:LONG_MATCH + len(tokens)])
    assert 2 <= len(tokens) < 8  # a few rows: the estimate is a prior, not yet evidence
    short_spec, short, short_out = fresh_plan([50] + BLOCK + [99] + BLOCK[:LONG_MATCH - 1])
    assert short_out == {} and short.spec.shadows  # one token less: the source's prior; judged for free
    # What the long guess's verification shows teaches the long-match estimates only.
    spec.verified(seq, DraftKind.NGRAM, drafted=len(tokens), judged=len(tokens), accepted=0)
    assert seq.spec.estimate(DraftKind.NGRAM, False, True).misses == 1
    assert seq.spec.estimate(DraftKind.NGRAM, False, False).misses == 0
    assert spec.p(seq, DraftKind.NGRAM, long=True) < short_spec.p(short, DraftKind.NGRAM, long=True)
    assert spec.p(seq, DraftKind.NGRAM) == short_spec.p(short, DraftKind.NGRAM)  # a chance guess's unchanged


CODE = ("def shelf_total(inventory, shelf):\n    count = 0\n    for item in inventory.items:\n"
        "        if item.shelf == shelf:\n            count += item.quantity\n    return count\n\n"
        "def restock(inventory, item, amount):\n    inventory.items[item].quantity += amount\n")
PROSE = ("Speculative decoding lets a small guesser propose several tokens that the large model then "
         "checks in one pass; when the guesses are right the reply moves ahead")


def run(mode, prompt, reply):
    backend = SimulatedBackend("cpu2core", n_ctx=32768, n_batch=2048, reply=reply)
    engine, _ = engine_for(backend, policy="target:50", spec=mode)
    engine.submit(chat("r", "s", prompt, max_tokens=64))
    reports = engine.run_until_idle()
    assert_clean(engine, "s")
    return text(by_request(reports)["r"]), [r.draft_rows for r in reports if r.updates]


def test_a_reply_copying_a_block_of_its_prompt_drafts_long_once_the_match_is_long():
    # The fake backend's tokens are characters: the reply's match with the prompt's block grows by
    # one a step. After "def " the lookup guesses the block's second function (its latest "def "),
    # a chance match that misses. Once LONG_MATCH characters agree the guess has its own estimate,
    # which that miss did not lower: it drafts several rows at once and K_MAX next. One estimate
    # for both crept back a row at a time (1, 1, 2, 3, 4, 5 rows; 17 steps for the reply).
    # The engine's first MIN_PLAIN decode steps at a width go without drafts (the row price is
    # measured against them, tests/test_spec_row_price.py), so this fresh engine drafts from the
    # reply's 4th token on.
    off, off_rows = run("off", "Rewrite this:\n" + CODE, CODE)
    auto, rows = run("auto", "Rewrite this:\n" + CODE, CODE)
    assert auto == off == CODE[:64] and not any(off_rows)
    assert rows[:1 + MIN_PLAIN] == [0] * (1 + MIN_PLAIN)  # the prompt's step, then the plain ones
    assert 1 <= rows[1 + MIN_PLAIN] <= 2  # the chance match's guess after "def ", on the prior
    first_long = next(i for i, r in enumerate(rows) if r >= 4)
    assert first_long <= LONG_MATCH + 1  # the step whose latest LONG_MATCH characters match the block
    assert len(rows) <= 14  # 64 tokens in 14 steps or fewer: about 5 a step


def test_a_reply_whose_guesses_come_from_chance_matches_drafts_nothing():
    off, _ = run("off", "hi", PROSE)
    auto, rows = run("auto", "hi", PROSE)
    assert auto == off and not any(rows)
