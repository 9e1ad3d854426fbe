"""Planner tests in vLLM's style: build from numbers, add requests, call schedule(), assert rows."""

from __future__ import annotations

import random

import pytest

from backend.fake import FakeBackend
from backend.protocol import DecodeOutcome
from scheduler.budget import GAP_SLACK
from scheduler.cost_model import CostParams
from scheduler.planner import RequestError, Scheduler
from scheduler.types import DoneReason, Phase
from tests.planner_driver import TOKEN, add, close_all, generating, make, rows, step


def test_decode_rows_first_in_seq_id_order_then_prompt_rows():
    sched, kv = make("fixed:32")
    gens = generating(sched, kv, 3)
    newcomer = add(sched, "new", 100)
    plan = step(sched, kv)
    assert [sl.is_decode for sl in plan.slices] == [True, True, True, False]
    assert [sl.seq_id for sl in plan.slices[:3]] == sorted(g.seq_id for g in gens)
    assert rows(plan) == {**{g.seq_id: 1 for g in gens}, newcomer.seq_id: 32}
    assert plan.budget == 3 + 32
    close_all(sched)


def test_long_prompt_is_split_across_steps_and_only_the_last_chunk_wants_logits():
    sched, kv = make("fixed:32")
    seq = add(sched, "a", 100)
    plans = [step(sched, kv) for _ in range(4)]
    assert [p.n_prefill for p in plans] == [32, 32, 32, 4]
    assert [p.slices[0].want_logits for p in plans] == [False, False, False, True]
    assert [p.slices[0].pos0 for p in plans] == [0, 32, 64, 96]
    assert seq.output == [TOKEN] and seq.phase is Phase.GENERATING
    assert kv.kv_tokens(seq.seq_id) == seq.prompt
    close_all(sched)


def test_prompt_rows_rotate_their_starting_sequence_round_robin():
    sched, kv = make("fixed:48")
    a, b, c = (add(sched, n, 400) for n in "abc")
    firsts = []
    for _ in range(6):
        plan = step(sched, kv)
        assert rows(plan) == {a.seq_id: 16, b.seq_id: 16, c.seq_id: 16}
        firsts.append(plan.slices[0].seq_id)
    assert firsts == [a.seq_id, b.seq_id, c.seq_id] * 2
    close_all(sched)


def test_a_small_budget_takes_turns_so_every_newcomer_progresses():
    sched, kv = make("fixed:16")
    seqs = [add(sched, n, 64) for n in "abc"]
    got = [next(iter(rows(step(sched, kv)))) for _ in range(6)]
    assert got == [s.seq_id for s in seqs] * 2
    close_all(sched)


def test_decode_never_starves_behind_prompts_and_prompts_never_starve_behind_decode():
    sched, kv = make("target:10", n_seq_max=16)  # decode rows alone exceed the target
    sched.cost.seed(CostParams(fixed_ms=10.0, decode_ms=2.0, prefill_ms=1.0))
    gens = generating(sched, kv, 12)
    big = add(sched, "big", 300)
    # 12 decode rows take 34 ms: the step may take twice that, so 34 prompt rows fit beside them.
    chunk = int((1 + GAP_SLACK) * sched.cost.predict(12, 0) - sched.cost.predict(12, 0))
    assert chunk == 34
    while big.phase is not Phase.GENERATING:
        pending = len(big.prompt) - big.num_computed
        plan = step(sched, kv)
        assert plan.n_decode == 12 and plan.n_prefill == min(chunk, pending)
    assert all(len(g.output) >= 300 // chunk for g in gens)
    close_all(sched)


def test_with_nothing_generating_the_prompt_closest_to_its_first_token_goes_first():
    sched, kv = make("target:10", n_seq_max=16, n_batch=512)
    sched.cost.seed(CostParams(fixed_ms=10.0, decode_ms=2.0, prefill_ms=1.0))
    long_one = add(sched, "long", 900)
    subs = [add(sched, f"sub{i}", 200) for i in range(4)]
    plan = step(sched, kv)  # one micro-batch (512 rows), the shortest prompts first
    assert rows(plan) == {subs[0].seq_id: 200, subs[1].seq_id: 200, subs[2].seq_id: 112}
    assert [s.phase for s in subs[:2]] == [Phase.GENERATING] * 2 and long_one.num_computed == 0
    close_all(sched)


def test_prefill_first_runs_whole_prompts_alone_then_resumes_decode():
    sched, kv = make("prefill-first", n_batch=512)
    gens = generating(sched, kv, 2)
    big = add(sched, "big", 700)
    p1, p2, p3 = step(sched, kv), step(sched, kv), step(sched, kv)
    assert (p1.n_decode, p1.n_prefill, p2.n_decode, p2.n_prefill) == (0, 512, 0, 188)
    assert p3.n_decode == 3 and {g.seq_id for g in gens} <= set(rows(p3))
    assert big.phase is Phase.GENERATING
    close_all(sched)


def test_budget_is_never_exceeded_under_random_load():
    rng = random.Random(7)
    for policy in ("prefill-first", "fixed:7", "fixed:64", "target:30", "target:5"):
        sched, kv = make(policy, n_ctx=3000, n_seq_max=6, n_batch=128, gen_reserve=16)
        live, n = [], 0
        for _ in range(400):
            if rng.random() < 0.15 and n < 40:
                n += 1
                live.append(add(sched, f"r{n}", rng.randint(1, 300), max_tokens=rng.randint(1, 30)))
            if live and rng.random() < 0.03:
                sched.cancel(rng.choice(live).request_id)
            step(sched, kv)
            used = kv.kv_cells_used()
            assert used <= kv.n_ctx
        while sched.has_work():
            step(sched, kv)
        assert all(s.is_finished for s in live)
        close_all(sched)


def test_cancel_mid_prefill_keeps_the_committed_rows_for_the_next_turn():
    sched, kv = make("fixed:32")
    keep = add(sched, "keep", 10)
    seq = add(sched, "gone", 200, session="chat")
    step(sched, kv)
    step(sched, kv)
    slot, done = seq.seq_id, seq.num_computed
    assert 0 < done < 200
    sched.cancel("gone")
    assert seq.phase is Phase.DONE and seq.done_reason is DoneReason.CANCELLED
    assert kv.kv_tokens(slot) == seq.prompt[:done] and sched.kv_used() == done + keep.num_computed
    session = sched.sessions["chat"]
    assert session.is_idle and session.seq_id == slot and session.tokens == seq.prompt[:done]
    plan = step(sched, kv)
    assert slot not in rows(plan)
    again = add(sched, "again", 0, session="chat", prompt=seq.prompt)
    plan = step(sched, kv)
    assert again.num_cached == done and again.seq_id == slot
    assert plan.slices[-1].seq_id == slot and plan.slices[-1].pos0 == done
    sched.finish(keep, DoneReason.STOP)
    close_all(sched)


def test_cancel_mid_generation_keeps_committed_kv_and_never_the_staged_rows():
    sched, kv = make("fixed:64")
    seq = add(sched, "t1", 30, session="chat")
    for _ in range(4):
        step(sched, kv)
    assert seq.phase is Phase.GENERATING and len(seq.output) == 4
    # The cancel lands while a step runs (the engine's order: decode, cancel, then commit): the
    # row that step evaluated was never committed, and the token it would sample never exists.
    plan = sched.schedule()
    result = kv.decode(plan)
    slot = seq.seq_id
    assert len(kv.kv_tokens(slot)) == 30 + 4
    sched.cancel("t1")
    assert sched.postprocess(plan, result) == []
    committed = seq.prompt + seq.output[:3]  # the 4th token was shown but its row never committed
    assert seq.num_computed == len(committed) and kv.kv_tokens(slot) == committed
    assert sched.sessions["chat"].tokens == committed and not sched.leaks()
    # The next turn carries the shown reply on, and reuses all of the committed KV.
    nxt = add(sched, "t2", 0, session="chat", prompt=seq.prompt + seq.output + [7, 8, 9])
    plan = step(sched, kv)
    assert nxt.num_cached == len(committed) and rows(plan) == {slot: 4}
    close_all(sched)


def test_a_cancel_before_anything_committed_frees_the_slot_even_while_its_step_runs():
    sched, kv = make("fixed:32")
    seq = add(sched, "a", 100, session="chat")
    plan = sched.schedule()
    slot = seq.seq_id
    sched.cancel("a")  # between planning and the decode: nothing of it was ever committed
    assert slot in sched.free_slots() and "chat" not in sched.sessions
    result = kv.decode(plan)  # the planned rows still land natively...
    assert sched.postprocess(plan, result) == []
    assert kv.kv_pos_max(slot) == -1  # ...and are dropped, not left in a free slot
    close_all(sched)


def test_a_cancelled_conversation_is_evicted_like_any_idle_one():
    sched, kv = make("fixed:64", n_seq_max=1)
    a = add(sched, "a", 40, session="A")
    step(sched, kv)
    sched.cancel("a")
    assert sched.sessions["A"].tokens == a.prompt
    b = add(sched, "b", 20, session="B")
    step(sched, kv)
    assert b.seq_id == a.last_seq_id and "A" not in sched.sessions
    assert kv.kv_tokens(b.seq_id)[:20] == b.prompt
    close_all(sched)


def test_admission_is_fifo_and_waits_for_a_slot():
    sched, kv = make(n_seq_max=2)
    a, _b, c = add(sched, "a", 8, max_tokens=2), add(sched, "b", 8, max_tokens=50), add(sched, "c", 8)
    step(sched, kv)
    assert c.phase is Phase.QUEUED and "slot" in c.waiting_reason
    while not a.is_finished:
        step(sched, kv)
    # a's conversation stays resident while idle, then is evicted (LRU) for c.
    step(sched, kv)
    assert c.phase is not Phase.QUEUED and c.seq_id == a.last_seq_id
    assert "s-a" not in sched.sessions
    close_all(sched)


def test_admission_waits_for_kv_room_and_says_so():
    sched, kv = make(n_ctx=700, gen_reserve=100)
    a = add(sched, "a", 300, max_tokens=5)
    b = add(sched, "b", 300)
    step(sched, kv)
    assert b.phase is Phase.QUEUED and "KV room" in b.waiting_reason
    while not a.is_finished:
        step(sched, kv)
    step(sched, kv)  # a's idle cache is evicted to make room
    assert b.phase is Phase.PREFILL
    close_all(sched)


def test_a_prompt_that_can_never_fit_fails_at_once():
    sched, _ = make(n_ctx=256)
    with pytest.raises(RequestError, match="only 256"):
        add(sched, "huge", 300)
    with pytest.raises(RequestError, match="empty"):
        add(sched, "empty", 0)
    assert sched.is_empty()


def test_next_turn_keeps_the_common_prefix_and_prefills_only_the_rest():
    sched, kv = make("fixed:512")
    first = add(sched, "t1", 50, session="chat", max_tokens=3)
    while not first.is_finished:
        step(sched, kv)
    history = first.prompt + first.output[:2]  # what the KV holds: the last token was never fed
    assert kv.kv_tokens(first.last_seq_id) == history
    second = add(sched, "t2", 0, session="chat", prompt=history + [TOKEN, 5, 6, 7])
    plan = step(sched, kv)
    assert second.num_cached == len(history) and second.seq_id == first.last_seq_id
    assert plan.slices[0].pos0 == len(history) and len(plan.slices[0].tokens) == 4
    close_all(sched)


def test_an_identical_prompt_still_prefills_one_row_to_get_logits():
    sched, kv = make("fixed:512")
    first = add(sched, "t1", 20, session="chat", max_tokens=1)
    step(sched, kv)
    again = add(sched, "t2", 20, session="chat")
    plan = step(sched, kv)
    assert again.num_cached == 19 and rows(plan) == {again.seq_id: 1} and first.is_finished
    close_all(sched)


def test_fork_copies_the_parent_prefix_and_shares_its_cells():
    sched, kv = make("fixed:512", n_ctx=8192, n_batch=1024)
    parent = add(sched, "p", 1000, session="parent", max_tokens=1)
    while not parent.is_finished:
        step(sched, kv)
    used = kv.kv_cells_used()
    kids = [add(sched, f"k{i}", 0, session=f"kid{i}", fork_from="parent",
                prompt=parent.prompt + [200 + i] * 10) for i in range(4)]
    plan = step(sched, kv)
    assert all(k.num_cached == 1000 for k in kids)
    assert sorted(rows(plan).values()) == [10] * 4
    assert kv.kv_cells_used() == used + 40  # the 1,000-token prefix is shared, not copied
    close_all(sched)


def test_failed_decode_commits_nothing():
    sched, kv = make("fixed:32")
    seq = add(sched, "a", 100)
    step(sched, kv)
    kv.fail_next(DecodeOutcome.ABORTED)
    plan = sched.schedule()
    assert sched.postprocess(plan, kv.decode(plan)) == []
    assert seq.num_computed == 32 and kv.kv_pos_max(seq.seq_id) == 31
    assert step(sched, kv).slices[0].pos0 == 32
    close_all(sched)


def test_no_kv_slot_retries_smaller_then_preempts_the_newest():
    sched, kv = make("fixed:64")
    old = generating(sched, kv, 2)
    new = add(sched, "new", 300)
    step(sched, kv)
    kv.fail_next(DecodeOutcome.NO_KV_SLOT, times=7)
    sizes = []
    while new.phase is not Phase.QUEUED:
        plan = sched.schedule()
        sizes.append(plan.n_prefill)
        assert plan.n_decode == 2
        assert sched.postprocess(plan, kv.decode(plan)) == []
    assert sizes == [64, 32, 16, 8, 4, 2, 1]  # smaller and smaller, then preemption
    assert new.num_computed == 0 and new.seq_id is None and kv.kv_cells_used() == 2 * 5
    assert "preempted" in new.waiting_reason and sched.waiting[0] is new
    assert all(s.phase is Phase.GENERATING for s in old)
    step(sched, kv)
    assert new.phase is Phase.QUEUED  # held back until something frees KV
    sched.finish(old[0], DoneReason.STOP)
    while new.phase is not Phase.GENERATING:
        step(sched, kv)
    assert kv.kv_tokens(new.seq_id) == new.prompt
    close_all(sched)


def test_preempted_generation_recomputes_prompt_and_output_keeping_every_token():
    sched, kv = make("fixed:64")
    a, b = generating(sched, kv, 2, prompt=20)
    for _ in range(5):
        step(sched, kv)
    shown = list(b.output)
    sched.preempt(b)
    sched.finish(a, DoneReason.STOP)
    while b.num_computed < len(b.prompt) + len(shown):
        step(sched, kv)
    assert b.output[: len(shown)] == shown and len(b.output) == len(shown) + 1
    assert kv.kv_tokens(b.seq_id) == b.prompt + shown
    close_all(sched)


class _PerSequenceCount(FakeBackend):
    """Counts KV like the llama.cpp backend can: positions summed over sequences, so a prefix
    shared by forks counts once per fork."""

    def kv_cells_used(self) -> int:
        return sum(self.kv_pos_max(s) + 1 for s in range(self.n_seq_max))


def test_fork_admission_counts_shared_prefix_cells_once():
    kv = _PerSequenceCount(n_ctx=2048, n_seq_max=9, n_batch=512)
    sched = Scheduler(kv, n_ctx=2048, n_seq_max=9, n_batch=512, policy="fixed:512", gen_reserve=16)
    parent = add(sched, "p", 1000, session="parent", max_tokens=1)
    while not parent.is_finished:
        step(sched, kv)
    kids = [add(sched, f"k{i}", 0, session=f"kid{i}", fork_from="parent",
                prompt=parent.prompt + [300 + i] * 10, max_tokens=8) for i in range(8)]
    step(sched, kv)
    assert all(k.phase is not Phase.QUEUED and k.num_cached == 1000 for k in kids)
    assert kv.kv_cells_used() > 8000 and sched.kv_used() == 1000 + 80
    close_all(sched)


def test_share_rows_deals_in_turns():
    from scheduler.budget import share_rows

    assert share_rows("abc", [100, 5, 100], 40, 16) == [("a", 19), ("b", 5), ("c", 16)]
    assert share_rows("ab", [3, 4], 100, 50) == [("a", 3), ("b", 4)]
    assert share_rows("ab", [30, 30], 0, 16) == []


def test_a_fork_never_waits_forever_on_its_idle_parent_slot():
    sched, kv = make("fixed:512", n_seq_max=1)
    parent = add(sched, "p", 30, session="parent", max_tokens=1)
    step(sched, kv)
    assert parent.is_finished and "parent" in sched.sessions
    kid = add(sched, "k", 0, session="kid", fork_from="parent", prompt=parent.prompt + [7, 8])
    step(sched, kv)
    assert kid.phase is Phase.GENERATING and kid.num_cached == 0 and "parent" not in sched.sessions
    close_all(sched)


def test_a_new_conversation_shares_the_longest_prefix_any_idle_one_holds():
    # An agent re-sends its whole history under a new id: the idle conversation that already
    # holds it lends its cells, so only the new tail is evaluated.
    sched, kv = make("fixed:512")
    history = [200 + i for i in range(40)]
    first = add(sched, "turn1", 0, session="call-1", max_tokens=1, prompt=history)
    other = add(sched, "other", 0, session="call-x", max_tokens=1, prompt=history[:20] + [9] * 30)
    while not (first.is_finished and other.is_finished):
        step(sched, kv)
    cells = kv.kv_cells_used()
    second = add(sched, "turn2", 0, session="call-2", prompt=history + [300 + i for i in range(10)])
    plan = step(sched, kv)
    assert second.num_cached == 40 and rows(plan) == {second.seq_id: 10}
    assert kv.kv_cells_used() == cells + 10  # shared, not copied
    close_all(sched)


def test_a_short_common_opening_is_not_shared():
    sched, kv = make("fixed:512")
    a = add(sched, "a", 0, session="a", max_tokens=1, prompt=[7] * 10 + [1] * 30)
    while not a.is_finished:
        step(sched, kv)
    b = add(sched, "b", 0, session="b", prompt=[7] * 10 + [2] * 30)
    step(sched, kv)
    assert b.num_cached == 0
    close_all(sched)


def test_composing_a_batch_commits_nothing_and_numbers_each_plan():
    """Progress moves only in postprocess: the composer reads the running sequences, so composing
    the same step twice gives the same rows, and a plan that never ran leaves no trace."""
    sched, kv = make("fixed:32")
    gens = generating(sched, kv, 2)
    newcomer = add(sched, "new", 100)
    sched.schedule()  # admits the newcomer
    computed = [s.num_computed for s in (*gens, newcomer)]
    first = sched.composer.compose(sched.running, sched.waiting, 0.0)
    again = sched.composer.compose(sched.running, sched.waiting, 0.0)
    assert first is not None and again is not None
    assert rows(first) == rows(again) == {**{g.seq_id: 1 for g in gens}, newcomer.seq_id: 32}
    assert again.step == first.step + 1
    assert [s.num_computed for s in (*gens, newcomer)] == computed
    assert kv.kv_tokens(newcomer.seq_id) == []
    close_all(sched)
