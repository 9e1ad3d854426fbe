"""The speculation policy with plain numbers: n-gram lookup, the acceptance estimate, and how many
draft rows pay on a CPU and on a GPU profile."""

from __future__ import annotations

import pytest

from scheduler.drafts import DraftKind
from scheduler.ngram import NgramIndex, NgramSource
from scheduler.speculation import (
    K_MAX,
    AcceptanceEstimate,
    DraftOffer,
    SpecMode,
    available_sources,
    draft_lengths,
    parse_spec_mode,
    pick_source,
)

# The simulated profiles' per-row costs (backend/simulated.py), as the cost model holds them.
CPU = dict(fixed=4.3, row=6.7)  # 2 EPYC cores, SmolLM2-135M: 11 ms for 1 sequence, 58 ms for 8
GPU = dict(fixed=14.6, row=1.3875)  # RX 9070 XT, 9B: the step is mostly reading the weights once


def lengths(profile, n_seqs, p, cap=K_MAX, room_rows=512, room_ms=None):
    base = profile["fixed"] + profile["row"] * n_seqs
    offers = [DraftOffer(p=p, cap=cap, row_ms=profile["row"])] * n_seqs
    return draft_lengths(offers, base_ms=base, base_tokens=n_seqs, room_rows=room_rows, room_ms=room_ms)


def test_ngram_lookup_proposes_what_followed_the_longest_earlier_match():
    index = NgramIndex()
    index.extend([1, 2, 3, 4, 5, 9, 9, 2, 3, 4])
    # Suffix (2, 3, 4) occurred before, followed by 5, 9, 9, 2 ...
    assert index.lookup(3) == [5, 9, 9]
    index.extend([7])
    # (4, 7) never occurred, nor does any longer suffix; a single token is not a match.
    assert index.lookup(3) == []
    index.extend([1, 2])
    assert index.lookup(2) == [3, 4]  # (1, 2) at the start; the latest (2,) alone would not count


def test_ngram_lookup_prefers_the_latest_occurrence_and_never_matches_the_suffix_itself():
    index = NgramIndex()
    index.extend([5, 6, 1, 5, 6, 2, 5, 6])
    assert index.lookup(1) == [2]  # the latest earlier (5, 6) was followed by 2, not 1
    fresh = NgramIndex()
    fresh.extend([8, 9])
    assert fresh.lookup(4) == []  # the only (8, 9) is the suffix itself


def test_ngram_source_keeps_one_index_per_sequence_and_rebuilds_when_tokens_are_rewritten():
    src = NgramSource()
    assert src.propose(0, [1, 2, 3, 1, 2], 2) == [3, 1]
    assert src.propose(0, [1, 2, 3, 1, 2, 3], 3) == [1, 2, 3]  # extended, not rescanned
    assert src._index[0].tokens == [1, 2, 3, 1, 2, 3]
    assert src.propose(1, [7, 8, 7], 2) == []  # another sequence, its own index
    assert src.propose(0, [4, 4, 9, 4, 4], 2) == [9, 4]  # other tokens on the key: rebuilt
    src.forget(0)
    assert 0 not in src._index
    assert src.draft_ms(8, 16) == 0.0 and src.propose(1, [1, 2, 1, 2], 0) == []


def test_the_acceptance_estimate_is_hits_over_trials_drawn_toward_the_prior():
    est = AcceptanceEstimate()
    assert est.p(prior=0.5) == 0.5
    for _ in range(40):
        est.observe(accepted=3, rejected=True)  # 3 of 4 judged each time: p = 0.75
    assert est.p(prior=0.5) == pytest.approx(0.75, abs=0.02)
    for _ in range(40):
        est.observe(accepted=0, rejected=True)
    # It moves (recent verifications count most); the prior's 4 observations keep it off 0.
    assert est.p(prior=0.5) < 0.2


def test_one_sequence_on_a_cpu_drafts_a_few_rows_when_acceptance_is_high():
    # 1 sequence, step 11 ms for 1 token (0.091/ms; with the margin 0.105/ms). p = 0.9: the first
    # row buys 0.9 tokens for 6.7 ms (0.134/ms), the second 0.81 (0.121/ms, raising 1.9/17.7 =
    # 0.107); the third 0.73 (0.109/ms) beats the margin but would lower 2.71/24.4 = 0.111.
    assert lengths(CPU, 1, 0.9) == [2]
    assert lengths(CPU, 1, 0.95) == [4]  # the fifth (0.77/6.7 = 0.115) would lower 4.52/37.8 = 0.120
    assert lengths(CPU, 1, 0.5) == [0]  # 0.5/6.7 = 0.075 < 0.091: no row pays


def test_a_copy_near_certain_to_go_on_drafts_long_where_rows_cost_most_of_a_step():
    """The margin is over the step without drafts, not over the ratio reached so far: a row at 0.6
    of a step that is accepted for sure buys 1.67 tokens per step's time, and every one of K_MAX
    such rows raises the ratio (9 tokens in 5.8 steps: 1.55x). Measured against the ratio reached,
    the margin stopped it at 4 rows (5 tokens in 3.4 steps: 1.47x) and at 0.95 at 2."""
    def k(p):
        return draft_lengths([DraftOffer(p=p, cap=K_MAX, row_ms=6.0)], base_ms=10.0, base_tokens=1, room_rows=512)
    assert k(1.0) == [K_MAX]
    assert k(0.98) == [7]
    assert k(0.95) == [4]
    assert k(0.8) == [1]  # 0.8/6 = 0.133 > 0.115; a second (0.64/6 = 0.107) not


def test_eight_and_sixteen_sequences_on_a_cpu_never_draft():
    # 8 sequences: 58 ms for 8 tokens (0.138/ms); even p = 0.9 buys 0.134/ms per row.
    assert lengths(CPU, 8, 0.9) == [0] * 8
    assert lengths(CPU, 16, 0.9) == [0] * 16


def test_a_gpu_step_dominated_by_the_weights_drafts_long_at_low_width():
    # 1 sequence: 16 ms per token; a 1.39 ms row that buys 0.9^j tokens pays up to K_MAX.
    assert lengths(GPU, 1, 0.9) == [K_MAX]
    # 4 sequences at 0.8: 3 rows each take the step from 4 tokens in 20.2 ms to 11.8 in 36.8 ms
    # (0.32/ms); a fourth row buys 0.41 tokens for 1.39 ms (0.29/ms) and would lower it.
    assert lengths(GPU, 4, 0.8) == [3] * 4
    assert lengths(GPU, 16, 0.3) == [0] * 16  # 36.8 ms for 16 tokens: 0.3/1.39 = 0.216 < 0.435


def test_draft_rows_respect_the_caps_rooms_and_the_sources_cost():
    assert lengths(GPU, 1, 0.9, cap=3) == [3]
    assert sum(lengths(GPU, 4, 0.9, room_rows=5)) == 5
    assert lengths(GPU, 1, 0.9, room_ms=3.0) == [2]  # 2 rows of 1.39 ms fit in 3 ms
    # A draft model that costs 12 ms per drafted token (serial steps): 0.7 tokens for 13.4 ms
    # is worth less than the 1 token per 16 ms the step makes anyway.
    offer = DraftOffer(p=0.7, cap=K_MAX, row_ms=GPU["row"])
    slow = draft_lengths([offer], base_ms=16.0, base_tokens=1, room_rows=64, draft_ms=[lambda k, n: 12.0 * k])
    assert slow == [0]
    cheap = draft_lengths([offer], base_ms=16.0, base_tokens=1, room_rows=64, draft_ms=[lambda k, n: 0.2 * k])
    assert cheap[0] >= 3


def test_rows_go_to_the_sequences_most_likely_to_accept_them():
    offers = [DraftOffer(p=0.95, cap=K_MAX, row_ms=1.0), DraftOffer(p=0.2, cap=K_MAX, row_ms=1.0)]
    ks = draft_lengths(offers, base_ms=10.0, base_tokens=2, room_rows=4)
    assert ks[0] == 4 and ks[1] == 0


def test_a_sequence_drafts_from_the_source_that_buys_the_most_tokens_per_ms():
    # The model as its own draft accepts 0.95 but costs a whole 11 ms step per drafted token; the
    # free lookup accepts 0.7. Per ms of step the lookup wins (0.7/6.7 against 0.95/17.7), so auto
    # drafts with it instead of picking the draft model and then pricing it out.
    assert pick_source([(0.95, 11.0), (0.7, 0.0)], row_ms=CPU["row"]) == 1
    # A cheap draft model (a tiny one beside a large target) that predicts better wins.
    assert pick_source([(0.95, 0.5), (0.7, 0.0)], row_ms=GPU["row"] * 4) == 0


def test_spec_modes_parse_and_a_forced_mode_needs_its_source():
    assert parse_spec_mode(" Auto ") is SpecMode.AUTO and parse_spec_mode(SpecMode.OFF) is SpecMode.OFF
    with pytest.raises(ValueError, match="off, ngram, draft or auto"):
        parse_spec_mode("lookahead")
    ngram = {DraftKind.NGRAM: NgramSource()}
    assert available_sources(SpecMode.OFF, ngram) == []
    assert [s.kind for s in available_sources(SpecMode.AUTO, ngram)] == [DraftKind.NGRAM]
    with pytest.raises(ValueError, match="--draft-model"):
        available_sources(SpecMode.DRAFT, ngram)


def test_a_row_that_could_not_pay_even_if_accepted_for_sure_is_not_worth_a_guess():
    from scheduler.speculation import row_can_pay

    def base(profile, n):
        return profile["fixed"] + profile["row"] * n

    assert row_can_pay(CPU["row"], base(CPU, 1), 1)  # 11 ms for 1 token: a sure 6.7 ms row pays
    assert not row_can_pay(CPU["row"], base(CPU, 8), 8)  # 58 ms for 8: 1/6.7 < 1.15 x 8/58
    assert not row_can_pay(CPU["row"], base(CPU, 16), 16)
    assert row_can_pay(GPU["row"], base(GPU, 16), 16)  # 36.8 ms for 16: a sure 1.39 ms row pays
    # The bound agrees with draft_lengths at p = 1 (where a row either passes the bar or nothing does).
    for profile in (CPU, GPU):
        for n in (1, 2, 4, 8, 16):
            assert row_can_pay(profile["row"], base(profile, n), n) == (lengths(profile, n, 1.0)[0] > 0)


def test_a_row_after_an_accepted_one_has_its_own_estimate():
    from scheduler.speculation import observe_run

    first, deeper = AcceptanceEstimate(), AcceptanceEstimate()
    observe_run(first, deeper, 0, 3, True)  # rows 1-3 accepted, row 4 rejected
    assert (first.hits, first.misses, deeper.hits, deeper.misses) == (1, 0, 2, 1)
    observe_run(first, deeper, 0, 0, True)  # the first row rejected: nothing about deeper rows
    assert (first.hits, first.misses) == (0.92, 1) and (deeper.hits, deeper.misses) == (2, 1)
    first, deeper = AcceptanceEstimate(), AcceptanceEstimate()
    observe_run(first, deeper, 2, 4, False)  # a guess's tail from depth 2 on: 4 hits, none missed
    assert (first.hits, first.misses, deeper.hits, deeper.misses) == (0, 0, 4, 0)


def test_a_copy_that_goes_on_once_it_starts_drafts_longer_than_one_rate_says():
    # One sequence on the CPU, first row accepted 9 times in 10: one geometric rate gives 2 rows
    # (the third, 0.73 tokens for 6.7 ms, would lower 1.9 + 0.81 tokens in 24.4 ms); if a row after
    # an accepted one is accepted 99 times in 100 (a copy runs on), every row up to K_MAX raises it
    # (the eighth buys 0.84 tokens for 6.7 ms = 0.125/ms, over 7.11 tokens in 57.9 ms = 0.123/ms).
    def one(p_more):
        offer = DraftOffer(p=0.9, cap=K_MAX, row_ms=CPU["row"], p_more=p_more)
        return draft_lengths([offer], base_ms=CPU["fixed"] + CPU["row"], base_tokens=1, room_rows=512)

    assert one(None) == [2] and one(0.9) == [2]
    assert one(0.99) == [K_MAX]


def test_a_guess_not_verified_is_judged_at_every_depth_against_the_tokens_that_come():
    # The lookup's whole guess, not only its first token: a reply that copies teaches the deeper
    # estimate for free while the sequence drafts nothing, and the judging waits for the tokens.
    from scheduler.sequence import Sequence
    from scheduler.speculation import Shadow
    from scheduler.speculator import Speculator
    from scheduler.types import Request, SamplingParams

    spec = Speculator({DraftKind.NGRAM: NgramSource()}, SpecMode.AUTO)
    seq = Sequence(Request("r", "s", (), SamplingParams()), [1, 2, 3], t_submit=0.0)
    seq.spec.shadows = [Shadow(DraftKind.NGRAM, 3, (7, 8, 9, 10))]
    seq.output += [7, 8]  # two tokens came, both as guessed
    spec._judge_shadow(seq)
    first, deeper = seq.spec.estimate(DraftKind.NGRAM), seq.spec.estimate(DraftKind.NGRAM, True)
    assert (first.hits, deeper.hits, deeper.misses) == (1, 1, 0) and seq.spec.shadows[0].depth == 2
    spec._judge_shadow(seq)  # nothing new came: nothing counted twice
    assert (first.hits, deeper.hits) == (1, 1)
    seq.output += [9, 5]  # depth 2 hit, depth 3 missed: decided
    spec._judge_shadow(seq)
    assert (first.hits, first.misses) == (1, 0)
    assert (round(deeper.hits, 2), deeper.misses) == (1.92, 1) and seq.spec.shadows == []
    assert spec.p(seq, DraftKind.NGRAM, deeper=True) != spec.p(seq, DraftKind.NGRAM)


def _copy_begun(prompt: list[int]):
    """A sequence (prompt `prompt`) whose reply has begun copying it (its output 5, 6, 7), with
    a paraphrase's first-row misses and a copy's later hits as evidence, the Speculator on the
    n-gram lookup, and a function planning its next step: (speculator, sequence, plan)."""
    from scheduler.budget import StepShape
    from scheduler.cost_model import CostModel, CostParams
    from scheduler.sequence import Sequence
    from scheduler.speculator import Speculator
    from scheduler.types import Request, SamplingParams

    spec = Speculator({DraftKind.NGRAM: NgramSource()}, SpecMode.AUTO)
    seq = Sequence(Request("r", "s", (), SamplingParams(max_tokens=64)), prompt, t_submit=0.0)
    seq.seq_id, seq.num_computed = 0, len(seq.prompt)
    seq.output += [5, 6, 7]
    first, deeper = seq.spec.estimate(DraftKind.NGRAM), seq.spec.estimate(DraftKind.NGRAM, True)
    first.hits, first.misses = 1.0, 5.0  # the paraphrase's misses
    deeper.hits, deeper.misses = 20.0, 0.5  # a guess that starts right goes on right
    cost = CostModel(CostParams(fixed_ms=CPU["fixed"], decode_ms=CPU["row"], prefill_ms=CPU["row"]))
    shape = StepShape(decode_rows=1)

    def plan():
        out = spec.plan([seq], cost=cost, shape=shape, prefill_rows=0, room_rows=512, room_ms=None,
                        n_ctx_seq=4096)
        seq.spec.shadows = []  # judged elsewhere; these tests set the evidence by hand
        return out

    return spec, seq, plan


def test_a_copy_that_ran_to_the_end_of_a_step_drafts_on_at_the_rate_of_a_row_after_a_hit():
    # A reply that paraphrased first (the lookup's first rows missed) and then started copying: the
    # copy's next guess continues the same match, so its first row is priced like a row after an
    # accepted one. Priced as a fresh first row it drafted nothing and recovered only slowly.
    spec, seq, plan = _copy_begun([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1, 2])  # the lookup guesses 8, 9, ...
    assert plan() == {}  # nothing judged yet: a fresh first row at p ~ 0.3 does not pay
    spec.verified(seq, DraftKind.NGRAM, drafted=2, judged=2, accepted=2)  # a draft ran to its end
    kind, tokens = plan()[seq.seq_id]
    assert kind is DraftKind.NGRAM and tokens[:2] == (8, 9) and len(tokens) >= 2
    spec.verified(seq, DraftKind.NGRAM, drafted=2, judged=2, accepted=1)  # the copy broke off
    assert plan() == {}


def test_a_guess_from_a_new_place_after_a_copy_is_priced_as_a_fresh_first_row():
    # The copy's last judged token was a hit, but the reply then left it and the lookup found a
    # new place behind a 2-gram: that guess does not continue the copy (its match did not grow
    # by the tokens committed since), so its first row is priced at the first-row estimate, and
    # its outcome teaches that one. Priced as a row after a hit, such guesses drafted whole
    # drafts that were all rejected (the simulated GPU's quoting and repetitive replays).
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    elsewhere = [40, 41, 42, 43, 44, 45, 46, 47]
    spec, seq, plan = _copy_begun(text + list(range(100, 120)) + elsewhere + [1, 2])
    assert plan() == {}
    spec.verified(seq, DraftKind.NGRAM, drafted=2, judged=2, accepted=2)
    seq.output += [8, 9]
    assert plan()[seq.seq_id][1][:2] == (10, 11)  # the copy goes on: priced as a row after a hit
    spec.verified(seq, DraftKind.NGRAM, drafted=2, judged=2, accepted=2)
    seq.output += [10, 11, 40, 41]  # ...then the reply leaves it for a 2-gram found elsewhere
    assert seq.spec.copying[DraftKind.NGRAM]  # the last judged token was a hit
    assert plan() == {}  # the guess 42, 43, ... is a fresh one at p ~ 0.3
    assert not seq.spec.copying[DraftKind.NGRAM]
    assert spec.sources[DraftKind.NGRAM].propose(0, seq.tokens_view(), 2) == [42, 43]


def test_a_guess_continuing_a_copy_teaches_the_estimate_it_was_priced_at_not_the_first_rows():
    """While a copy goes on, the lookup's next guess continues it and is priced at the rate of a row
    after a hit; its outcome teaches that estimate. Counted as first rows, the copy's hits made a
    fresh guess after the copy broke look ~0.8 likely: on the real model it drafted 2-3 rows there
    and lost them all, step after step."""
    from scheduler.sequence import Sequence
    from scheduler.speculator import Speculator
    from scheduler.types import Request, SamplingParams

    spec = Speculator({DraftKind.NGRAM: NgramSource()}, SpecMode.AUTO)
    seq = Sequence(Request("r", "s", (), SamplingParams(max_tokens=64)), [1, 2, 3], t_submit=0.0)
    first, deeper = seq.spec.estimate(DraftKind.NGRAM), seq.spec.estimate(DraftKind.NGRAM, True)
    spec.verified(seq, DraftKind.NGRAM, drafted=3, judged=3, accepted=3)  # a fresh guess, all right
    assert (first.hits, first.misses, deeper.hits, deeper.misses) == (1, 0, 2, 0)
    assert seq.spec.copying[DraftKind.NGRAM]
    spec.verified(seq, DraftKind.NGRAM, drafted=4, judged=4, accepted=2)  # the copy goes on, then breaks
    assert (first.hits, first.misses) == (1.0, 0.0)  # untouched
    assert (round(deeper.hits, 4), deeper.misses) == (round(2 * 0.92 + 2, 4), 1.0)
    assert not seq.spec.copying[DraftKind.NGRAM]
    spec.verified(seq, DraftKind.NGRAM, drafted=2, judged=1, accepted=0)  # a fresh guess after it: a miss
    assert (first.hits, first.misses) == (0.92, 1.0)
