"""Speculative decoding in the engine on the fake backend: scripted acceptance patterns, the KV rows
and ledger after each, replies ending inside a draft, cancel, "no KV slot", forks and next turns."""

from __future__ import annotations

import pytest

from backend.fake import DEFAULT_REPLY, Acceptance, FakeBackend, ScriptedDrafts
from backend.protocol import DecodeOutcome
from scheduler.drafts import DraftKind
from scheduler.ngram import NgramSource
from scheduler.speculation import SpecMode
from scheduler.types import DoneReason, Message, Request, SamplingParams
from tests.counting_list import CountingList
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text


def spec_engine(acceptance=Acceptance.ALL, *, eog_after=None, mode="draft", **kw):
    backend = FakeBackend(eog_after=eog_after, **{k: kw.pop(k) for k in list(kw) if k.startswith("n_")})
    drafts = ScriptedDrafts(backend, acceptance)
    engine, _ = engine_for(backend, spec=mode, drafts={DraftKind.DRAFT_MODEL: drafts}, **kw)
    return engine, backend, drafts


def assert_kv_matches(engine, backend):
    """Ledger equals the backend's cells, and every live sequence's KV holds exactly its committed
    tokens (no rejected draft row left behind)."""
    s = engine.scheduler
    assert s.kv.mismatches() == [] and s.kv_used() == backend.kv_cells_used()
    for seq in s.running:
        assert backend.kv_tokens(seq.seq_id) == seq.committed_tokens()


def on_first_speculative_step(backend, action):
    """Run `action` while the first step with draft rows runs; what it returns is that step's decode
    outcome (None: the step succeeds). Returns the list that receives that step's plan."""
    fired = []

    def hook(plan):
        if plan.n_draft and not fired:
            fired.append(plan)
            return action()
        return None

    backend.fault_when = hook
    return fired


def run_checked(engine, backend):
    reports = []
    while engine.has_work():
        r = engine.step()
        if r is not None:
            reports.append(r)
            assert_kv_matches(engine, backend)
    return reports


@pytest.mark.parametrize("acceptance, accepted_per_step", [
    (Acceptance.ALL, 8), (Acceptance.NONE, 0), (Acceptance.HALF, 4)])
def test_scripted_acceptance_gives_the_same_reply_with_the_right_rows_and_ledger(acceptance, accepted_per_step):
    engine, backend, drafts = spec_engine(acceptance, eog_after=40)
    engine.submit(chat("r", "s", "hello"))
    reports = run_checked(engine, backend)
    ups = by_request(reports)["r"]
    assert text(ups) == (DEFAULT_REPLY * 2)[:40] and ups[-1].done_reason is DoneReason.STOP
    spec_steps = [r for r in reports if r.draft_rows]
    assert spec_steps and all(r.decode_rows == 1 and r.draft_rows == 8 for r in spec_steps)
    # Every step but the last (where the EOS cuts the run) accepts the scripted share.
    assert [r.draft_accepted for r in spec_steps[:-1]] == [accepted_per_step] * (len(spec_steps) - 1)
    # The first token comes from the prompt's last row; then each step samples 1 + accepted,
    # the 40th token's row included (its sample is the EOS).
    assert len(spec_steps) == -(-40 // (1 + accepted_per_step))
    last = ups[-1]
    assert last.spec.accepted == sum(r.draft_accepted for r in reports) and last.spec.drafted == 8 * len(spec_steps)
    gen_steps = 1 + sum(1 for r in spec_steps if any(u.new_tokens for u in r.updates))
    assert last.spec.tokens_per_step == pytest.approx(40 / gen_steps)
    # The conversation keeps exactly the prompt and the reply's tokens: the row of the last one
    # was evaluated (its logits gave the EOS), no draft row after it stayed.
    seq_id = ups[-1].seq_id
    prompt = backend.tokenize_chat([Message("user", "hello")])
    assert backend.kv_tokens(seq_id) == prompt + [ord(c) for c in (DEFAULT_REPLY * 2)[:40]]
    assert_clean(engine, "s")
    assert seq_id in drafts.forgotten


def test_max_tokens_inside_an_accepted_draft_ends_the_reply_exactly_there():
    engine, backend, drafts = spec_engine(Acceptance.ALL)
    engine.submit(chat("r", "s", "hello", max_tokens=13))
    reports = run_checked(engine, backend)
    ups = by_request(reports)["r"]
    assert text(ups) == DEFAULT_REPLY[:13] and ups[-1].done_reason is DoneReason.LENGTH
    assert ups[-1].generated == 13
    # Drafts never reach past max_tokens: after the first token, 1 + 8, then 1 + 2.
    assert [r.draft_rows for r in reports if r.draft_rows] == [8, 2]
    prompt = backend.tokenize_chat([Message("user", "hello")])
    assert backend.kv_tokens(ups[-1].seq_id) == prompt + [ord(c) for c in DEFAULT_REPLY[:12]]
    assert_clean(engine, "s")


def test_a_stop_string_inside_an_accepted_draft_shows_and_keeps_nothing_after_it():
    engine, backend, _ = spec_engine(Acceptance.ALL)
    engine.submit(Request("r", "s", (Message("user", "hello"),), SamplingParams(max_tokens=64, stop=("brown",))))
    reports = run_checked(engine, backend)
    ups = by_request(reports)["r"]
    assert text(ups) == "The quick " and ups[-1].done_reason is DoneReason.STOP
    # The run stopped on the token that completed "brown": it is the last token committed, and
    # no draft row after it stayed in the cache.
    prompt = backend.tokenize_chat([Message("user", "hello")])
    assert backend.kv_tokens(ups[-1].seq_id) == prompt + [ord(c) for c in "The quick brow"]
    assert_clean(engine, "s")


def test_eos_inside_an_accepted_draft_ends_the_reply_and_trims_the_rows_after_it():
    engine, backend, _ = spec_engine(Acceptance.ALL, eog_after=5)
    engine.submit(chat("r", "s", "hello"))
    reports = run_checked(engine, backend)
    ups = by_request(reports)["r"]
    assert text(ups) == DEFAULT_REPLY[:5] and ups[-1].done_reason is DoneReason.STOP
    assert [r.draft_rows for r in reports if r.draft_rows] == [8]  # one step: 4 accepted, then EOS
    assert ups[-1].spec.accepted == 4
    # The 5th token's draft row was evaluated and accepted; its logits gave the EOS; the 3 draft
    # rows after it are gone.
    prompt = backend.tokenize_chat([Message("user", "hello")])
    assert backend.kv_tokens(ups[-1].seq_id) == prompt + [ord(c) for c in DEFAULT_REPLY[:5]]
    assert_clean(engine, "s")


def test_a_cancel_while_a_sequence_speculates_keeps_only_its_committed_rows():
    engine, backend, _ = spec_engine(Acceptance.ALL)
    engine.submit(chat("r", "s", "hello"))
    # The cancel arrives while the step runs: it is applied before sampling.
    seen = on_first_speculative_step(backend, lambda: engine.cancel("r"))
    reports = run_checked(engine, backend)
    ups = by_request(reports)["r"]
    assert ups[-1].done_reason is DoneReason.CANCELLED and text(ups) == DEFAULT_REPLY[:1]
    # Committed: the prompt; the first token was sampled but never evaluated. The step's decode
    # row and its 8 draft rows are all gone.
    prompt = backend.tokenize_chat([Message("user", "hello")])
    slot = seen[0].slices[0].seq_id
    assert backend.kv_tokens(slot) == prompt
    assert engine.scheduler.kv.mismatches() == []
    assert_clean(engine, "s")


def test_no_kv_slot_in_a_speculative_step_drops_the_drafts_first():
    engine, backend, _ = spec_engine(Acceptance.ALL)
    engine.submit(chat("r", "s", "hello"))
    failed = on_first_speculative_step(backend, lambda: DecodeOutcome.NO_KV_SLOT)
    engine.submit(chat("q", "t", "there"))
    reports = run_checked(engine, backend)
    outcomes = [r.outcome for r in reports]
    assert outcomes.count(DecodeOutcome.NO_KV_SLOT) == 1
    after = reports[outcomes.index(DecodeOutcome.NO_KV_SLOT) + 1]
    # The retry keeps every decode row and drops only the draft rows; nobody was preempted.
    assert after.draft_rows == 0 and after.decode_rows == failed[0].n_decode
    ups = by_request(reports)
    assert text(ups["r"]) == text(ups["q"]) == (DEFAULT_REPLY * 6)[:256]
    assert all(u.waiting_reason is None for u in ups["r"] + ups["q"])
    assert_clean(engine, "s", "t")


def test_forks_and_next_turns_give_the_same_replies_and_cache_with_speculation():
    def scenario(mode):
        backend = FakeBackend(eog_after=30)
        engine, _ = engine_for(backend, spec=mode)
        engine.submit(chat("a1", "A", "tell me a story"))
        engine.run_until_idle()
        story = DEFAULT_REPLY[:30]
        engine.submit(chat("a2", "A", "tell me a story", ("assistant", story), "again"))
        engine.submit(chat("f1", "F", "tell me a story", ("assistant", story), "a fork", fork_from="A"))
        reports = engine.run_until_idle()
        for r in reports:
            assert engine.scheduler.kv.mismatches() == []
        ups = by_request(reports)
        seen = {rid: (text(u), u[-1].cached_tokens, u[-1].done_reason) for rid, u in ups.items()}
        drafted = sum(r.draft_rows for r in reports)
        assert_clean(engine, "A", "F")
        return seen, drafted

    off, none_drafted = scenario("off")
    ngram, drafted = scenario("ngram")
    assert none_drafted == 0 and drafted > 0
    assert ngram == off
    assert off["a2"][1] > 30 and off["f1"][1] > 30  # the previous turn was reused as cache


def test_drafts_never_push_decode_rows_or_a_newcomers_prompt_quantum_out():
    engine, backend, _ = spec_engine(Acceptance.ALL, n_batch=24, n_ubatch=24, policy="fixed:16")
    for i in range(4):
        engine.submit(chat(f"r{i}", f"s{i}", "hi", max_tokens=60))
    while len(engine.scheduler.running) < 4 or not all(s.is_decoding for s in engine.scheduler.running):
        engine.step()
    slots = {s.seq_id for s in engine.scheduler.running}
    engine.submit(chat("new", "n", "a newcomer with a longer prompt than the others"))
    first = len(backend.decode_calls)
    reports = run_checked(engine, backend)
    for plan in backend.decode_calls:
        assert plan.n_rows <= 24
    newcomer_steps = [p for p in backend.decode_calls[first:] if any(not s.is_decode for s in p.slices)]
    assert len(newcomer_steps) > 2 and not any(s.seq_id in slots for p in newcomer_steps
                                               for s in p.slices if not s.is_decode)
    for plan in newcomer_steps[:-1]:  # every step but its last chunk: 4 decode rows, the quantum
        assert plan.n_decode == 4 and plan.n_prefill == 16 and plan.n_draft <= 4
    assert any(r.draft_rows for r in reports)
    ups = by_request(reports)
    assert all(ups[f"r{i}"][-1].done_reason is DoneReason.LENGTH for i in range(4))
    assert_clean(engine, "n", *(f"s{i}" for i in range(4)))


def test_the_mode_switches_live_and_draft_without_a_model_fails_at_once():
    engine, backend = engine_for(FakeBackend())
    assert engine.spec == "off"
    with pytest.raises(ValueError, match="--draft-model"):
        engine.set_spec("draft")
    with pytest.raises(ValueError, match="off, ngram, draft or auto"):
        engine.set_spec("fast")
    with pytest.raises(ValueError, match="--draft-model"):
        engine_for(FakeBackend(), spec=SpecMode.DRAFT)
    engine.submit(chat("r", "s", "hello", max_tokens=120))
    reports = [engine.step() for _ in range(3)]
    assert not any(r.draft_rows for r in reports if r)
    engine.set_spec("ngram")
    assert engine.spec == "ngram"
    reports = engine.run_until_idle()
    assert reports[0].spec == "ngram" and sum(r.draft_accepted for r in reports) > 0
    assert_clean(engine, "s")


PROSE = ("Speculative decoding lets a small guesser propose several tokens that the large model "
         "then checks in one pass; when the guesses are right the reply moves ahead by several "
         "tokens per step, and when they are wrong the extra rows were wasted work that other "
         "sequences in the same batch paid for with a slower step. Whether it pays depends on "
         "the hardware, the width of the batch and how predictable the text is. ")


@pytest.mark.parametrize("profile", ["cpu2core", "rx9070xt"])
@pytest.mark.parametrize("reply", [DEFAULT_REPLY, PROSE], ids=["repetitive", "prose"])
def test_auto_never_loses_to_off_and_wins_where_replies_repeat(profile, reply):
    from backend.simulated import SimulatedBackend

    def run(mode, n):
        backend = SimulatedBackend(profile, n_ctx=32768, n_batch=2048, reply=reply)
        engine, _ = engine_for(backend, policy="target:50", spec=mode)
        for i in range(n):
            engine.submit(chat(f"r{i}", f"s{i}", "hi", max_tokens=300))
        reports = engine.run_until_idle()
        texts = {rid: text(u) for rid, u in by_request(reports).items()}
        elapsed = reports[-1].t - reports[0].t
        assert_clean(engine, *(f"s{i}" for i in range(n)))
        return elapsed, sum(r.draft_rows for r in reports), texts

    for n in (1, 4, 16):
        t_off, _, off = run("off", n)
        t_auto, rows, auto = run("auto", n)
        assert auto == off
        assert t_off / t_auto >= 0.97, (n, t_off, t_auto, rows)
        if reply == DEFAULT_REPLY and n == 1:
            assert t_off / t_auto >= 1.3  # one sequence copying itself: drafting pays
        if reply == PROSE and profile == "cpu2core" and n == 16:
            assert rows == 0  # a draft row there costs what a decode row earns


def test_auto_drafts_with_the_free_lookup_when_the_draft_model_costs_more_than_it_buys():
    """A draft model that guesses every token right but costs most of a step per drafted token must
    not crowd out the n-gram lookup: auto picks, per sequence, the source that buys the most
    tokens per ms. Picking by acceptance alone chose the draft model (its prior beats the lookup's
    estimate on prose), priced it out, and drafted almost nothing (13 rows, 1.01x off)."""
    from backend.simulated import SimulatedBackend

    def run(mode):
        backend = SimulatedBackend("rx9070xt", n_ctx=32768, n_batch=2048, reply=PROSE)
        expensive = ScriptedDrafts(backend, Acceptance.ALL, ms=13.0)  # a 1-sequence step is ~16 ms
        engine, _ = engine_for(backend, policy="target:50", spec=mode, drafts={DraftKind.DRAFT_MODEL: expensive})
        engine.submit(chat("r", "s", "hi", max_tokens=300))
        reports = engine.run_until_idle()
        assert_clean(engine, "s")
        return reports[-1].t - reports[0].t, text(by_request(reports)["r"]), reports, expensive

    t_off, off, _, _ = run("off")
    t_auto, auto, reports, expensive = run("auto")
    assert auto == off
    assert sum(r.draft_rows for r in reports) > 100 and not expensive.proposed
    assert t_off / t_auto >= 1.05, (t_off, t_auto)


class CountingLookup(NgramSource):
    """n-gram lookup that counts the sequences it was asked to guess for."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def propose(self, key, tokens, k):
        self.asked += 1
        return super().propose(key, tokens, k)


@pytest.mark.parametrize("n, asked", [(16, False), (1, True)])
def test_auto_looks_nothing_up_where_no_draft_row_could_pay(n, asked):
    # At 16 sequences on a CPU even a draft accepted for sure buys less per ms than the step's decode
    # rows: auto drafts nothing there, so it must not spend a lookup per sequence per step either
    # (it did: 0.8 ms a step of the engine's own time at 16 sequences). One sequence still looks up.
    from backend.simulated import SimulatedBackend

    def run(mode):
        backend = SimulatedBackend("cpu2core", n_ctx=32768, n_batch=2048)
        lookup = CountingLookup()
        engine, _ = engine_for(backend, policy="target:50", spec=mode, drafts={DraftKind.NGRAM: lookup})
        for i in range(n):
            engine.submit(chat(f"r{i}", f"s{i}", "hi", max_tokens=64))
        reports = engine.run_until_idle()
        assert_clean(engine, *(f"s{i}" for i in range(n)))
        return {rid: text(u) for rid, u in by_request(reports).items()}, lookup.asked, reports

    off, _, _ = run("off")
    auto, lookups, reports = run("auto")
    assert auto == off
    assert (lookups > 0) is asked, lookups
    if not asked:
        assert sum(r.draft_rows for r in reports) == 0


class SyncCheckingLookup(NgramSource):
    """n-gram lookup that checks, at every guess, that its index holds exactly the sequence's
    committed tokens (prompt and output so far: never a rejected draft, never another request's)."""

    def __init__(self, engine_ref: list) -> None:
        super().__init__()
        self.engine_ref, self.checked = engine_ref, 0

    def propose(self, key, tokens, k):
        out = super().propose(key, tokens, k)
        seq = next(s for s in self.engine_ref[0].scheduler.running if s.seq_id == key)
        assert self._index[key].tokens == seq.prompt + seq.output
        self.checked += 1
        return out


def test_the_lookup_index_holds_exactly_the_committed_tokens_through_rejections_forks_and_turns():
    backend = FakeBackend(eog_after=30)
    ref: list = []
    lookup = SyncCheckingLookup(ref)
    engine, _ = engine_for(backend, spec="ngram", drafts={DraftKind.NGRAM: lookup})
    ref.append(engine)
    engine.submit(chat("a1", "A", "the quick brown fox, the quick brown cat"))  # the prompt's guesses miss
    first = engine.run_until_idle()
    story = text(by_request(first)["a1"])
    engine.submit(chat("a2", "A", "the quick brown fox", ("assistant", story), "again"))
    engine.submit(chat("f1", "F", "the quick brown fox", ("assistant", story), "a fork", fork_from="A"))
    later = engine.run_until_idle()
    reports = first + later
    drafted, accepted = sum(r.draft_rows for r in reports), sum(r.draft_accepted for r in reports)
    assert lookup.checked > 20 and 0 < accepted < drafted  # guesses were accepted and rejected
    assert {u[-1].done_reason for u in by_request(later).values()} == {DoneReason.STOP}
    assert_clean(engine, "A", "F")


@pytest.mark.parametrize("mode", ["ngram", "auto"])
def test_a_drafting_step_reads_the_new_tokens_not_the_whole_context(mode):
    # The lookup used to be handed prompt + output, joined anew every step for every drafting
    # sequence: O(context) a step. Its index already holds the prompt; a step reads what is new.
    backend = FakeBackend(n_ctx=8192, n_seq_max=2)
    engine, _ = engine_for(backend, spec=mode, drafts={DraftKind.NGRAM: NgramSource()})
    engine.submit(chat("r", "s", "hi " * 700, max_tokens=200))
    for _ in range(50):
        if engine.scheduler.running and engine.scheduler.running[0].is_decoding:
            break
        engine.step()
    seq = engine.scheduler.running[0]
    seq.prompt = CountingList(seq.prompt)
    reads, reports = [], []
    while engine.has_work():
        CountingList.reads = 0
        reports.append(engine.step())
        reads.append(CountingList.reads)
    assert sum(r.draft_accepted for r in reports if r) > 50 and len(seq.prompt) > 2000
    # The first guess indexes the prompt and the reply's end hands its tokens to the conversation;
    # every step between reads only tokens near the end (the old code: the whole prompt each step).
    assert len(reads) > 10 and max(reads[1:-1]) <= 16, reads
    assert_clean(engine, "s")
