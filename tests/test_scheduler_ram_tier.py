"""Evicted idle conversations' KV kept in host memory (scheduler/ram_tier.py): the next turn of an
agent whose slot went to a subagent restores its history instead of evaluating it again."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backend.fake import FakeBackend
from scheduler.ram_tier import MIN_TOKENS, RamTier
from scheduler.sequence import common_prefix_len
from tests.engine_driver import assert_clean, by_request, chat, engine_for

LONG = ("system", "You are agent A; you read files and answer in short. " * 12)


def test_the_tier_keeps_states_within_its_budget_dropping_the_oldest_first():
    tier = RamTier(budget=100)
    assert tier.put("a", list(range(70)), b"x" * 40) and tier.put("b", list(range(70)), b"y" * 40)
    assert tier.put("c", list(range(70)), b"z" * 40)  # 120 > 100: "a" goes
    assert "a" not in tier and "b" in tier and "c" in tier and tier.used == 80
    assert not tier.put("d", list(range(70)), b"w" * 101)  # larger than the whole budget
    assert tier.tokens("b") == list(range(70))
    assert tier.take("b") == (list(range(70)), b"y" * 40) and "b" not in tier and tier.used == 40
    tier.drop("c")
    assert len(tier) == 0 and tier.used == 0 and tier.take("c") is None
    assert not tier.wants(list(range(MIN_TOKENS - 1))) and tier.wants(list(range(MIN_TOKENS)))
    assert not RamTier(budget=0).wants(list(range(1000)))


@given(st.lists(st.integers(0, 2), max_size=9000), st.lists(st.integers(0, 2), max_size=300),
       st.integers(0, 9000), st.booleans())
def test_the_shared_prefix_is_counted_token_by_token_whatever_the_lengths(a, tail, cut, as_tuple):
    b = a[:cut] + tail
    expected = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    other = tuple(b) if as_tuple else b
    assert common_prefix_len(a, other) == expected and common_prefix_len(other, a) == expected


def test_the_longest_saved_prefix_is_found_again_after_every_change_of_the_tier():
    shared = list(range(5000))
    tier = RamTier(budget=1000)
    tier.put("a", shared[:3000] + [-1] * 100, b"a" * 10)
    tier.put("b", shared[:4000] + [-2] * 100, b"b" * 10)
    query = shared + [-3]
    assert tier.best_prefix(query) == ("b", 4000)
    assert tier.best_prefix(query) == ("b", 4000)  # asked again, unchanged
    tier.put("c", shared[:4500], b"c" * 10)
    assert tier.best_prefix(query) == ("c", 4500)
    tier.drop("c")
    assert tier.best_prefix(query) == ("b", 4000)
    assert tier.take("b") is not None and tier.best_prefix(query) == ("a", 3000)
    tier.put("d", shared[:10], b"d" * 995)  # the budget pushes "a" out
    assert "a" not in tier and tier.best_prefix(query) == ("d", 10)
    assert tier.best_prefix([7, 8]) == (None, 0)


def _evicted(engine, sid: str, first: str) -> None:
    """`sid` answers `first` after the long system prompt, then two others take both slots: `sid`,
    the least recently used, is evicted (to host memory when the tier is on)."""
    engine.submit(chat(f"{sid}1", sid, LONG, first))
    engine.run_until_idle()
    for other in ("X", "Y"):
        engine.submit(chat(f"{other}1", other, "hi"))
        engine.run_until_idle()
    assert sid not in engine.scheduler.sessions


def _evict_a_then_return(engine):
    """A answers, X and Y take the slots (A is evicted), then A's next turn; returns A's last
    update of that turn."""
    _evicted(engine, "A", "list the files")
    engine.submit(chat("a2", "A", LONG, "list the files", ("assistant", "The"), "now read one"))
    return by_request(engine.run_until_idle())["a2"][-1]


def test_an_evicted_conversation_comes_back_from_host_memory_not_from_a_new_prefill():
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    ram = engine.scheduler.residency.ram
    a2 = _evict_a_then_return(engine)
    assert ram.saved_count >= 1 and ram.restored_count == 1
    history = len(backend.tokenize_chat(chat("x", "A", LONG, "list the files").messages))
    assert a2.error is None and a2.cached_tokens >= history - 1
    assert "A" not in ram  # taken back: a slot holds it again
    assert_clean(engine, "A", "X", "Y")
    assert ram.used == 0 and len(ram) == 0


def test_without_the_tier_the_same_turn_is_evaluated_again():
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    engine.scheduler.residency.ram.budget = 0
    a2 = _evict_a_then_return(engine)
    assert a2.error is None and a2.cached_tokens == 0
    assert_clean(engine, "A", "X", "Y")


def test_a_state_the_backend_refuses_leaves_the_turn_to_a_cold_prefill():
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    ram = engine.scheduler.residency.ram
    _evicted(engine, "A", "list the files")
    tokens, _ = ram.take("A")
    ram.put("A", tokens, b"not a state")
    engine.submit(chat("a2", "A", LONG, "list the files", ("assistant", "The"), "now read one"))
    a2 = by_request(engine.run_until_idle())["a2"][-1]
    assert a2.error is None and a2.cached_tokens == 0 and "A" not in ram
    assert_clean(engine, "A", "X", "Y")


def test_closing_a_conversation_forgets_its_saved_state():
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    ram = engine.scheduler.residency.ram
    _evicted(engine, "A", "list the files")
    assert "A" in ram
    engine.close_session("A")
    engine.run_until_idle()
    assert "A" not in ram and ram.used == 0
    assert_clean(engine, "X", "Y")


def test_a_subagent_forked_from_a_parent_in_host_memory_brings_the_parent_back_and_shares_it():
    # Two slots. The parent answers, then X and Y take the slots (the parent goes to host memory);
    # a subagent forked from the parent then restores it and shares its prefix: it evaluated its
    # whole prompt before (a burst's first subagent did, 634 tokens, in bench agents).
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    ram = engine.scheduler.residency.ram
    _evicted(engine, "P", "plan")
    assert "P" in ram
    engine.submit(chat("s1", "S", LONG, "plan", ("assistant", "ok"), "check a file", fork_from="P"))
    s1 = by_request(engine.run_until_idle())["s1"][-1]
    history = len(backend.tokenize_chat(chat("x", "P", LONG, "plan").messages))
    assert s1.error is None and s1.cached_tokens >= history - 1
    assert "P" in engine.scheduler.sessions and "P" not in ram
    assert_clean(engine, "P", "X", "Y", "S")


def test_a_request_repeating_a_history_in_host_memory_brings_that_conversation_back_to_share_it():
    # As serve sees a subagent: a new conversation id (no fork_from) whose prompt repeats an
    # agent's history; that agent's slot went to others meanwhile, so its KV is in host memory.
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    ram = engine.scheduler.residency.ram
    _evicted(engine, "P", "plan")
    assert "P" in ram
    engine.submit(chat("s1", "S", LONG, "plan", ("assistant", "ok"), "check a file"))
    s1 = by_request(engine.run_until_idle())["s1"][-1]
    history = len(backend.tokenize_chat(chat("x", "P", LONG, "plan").messages))
    assert s1.error is None and s1.cached_tokens >= history - 1 and "P" not in ram
    assert_clean(engine, "P", "X", "Y", "S")


def test_a_state_kept_for_a_conversation_that_is_resident_again_is_never_restored_over_it():
    # A state saved before its conversation came back cold (no slot was free to restore into):
    # while that conversation ran, a prompt repeating its history restored the state over it and
    # failed ("could not set up its KV cache"). A conversation that runs again drops its state.
    engine, backend = engine_for(FakeBackend(n_seq_max=3, eog_after=3))
    ram = engine.scheduler.residency.ram
    engine.submit(chat("p1", "P", LONG, "plan"))
    engine.run_until_idle()
    p = engine.scheduler.sessions["P"]
    old = (list(p.tokens), backend.kv_save(p.slot))
    ram.put("P", *old)
    backend.eog_after = None  # P's next turn runs until it is cancelled
    engine.submit(chat("p2", "P", LONG, "plan", ("assistant", "The"), "go on", max_tokens=10_000))
    for _ in range(3):
        engine.step()
    assert engine.scheduler.sessions["P"].live is not None and "P" not in ram
    ram.put("P", *old)  # as a cold admission left it
    backend.eog_after = 3
    engine.submit(chat("s1", "S", LONG, "plan", ("assistant", "ok"), "check a file"))
    reports = [engine.step() for _ in range(40)]
    engine.cancel("p2")
    reports += engine.run_until_idle()
    s1 = by_request([r for r in reports if r is not None])["s1"][-1]
    assert s1.done_reason is not None and s1.error is None and "P" not in ram
    assert_clean(engine, "P", "S")


def test_step_reports_say_what_the_tier_holds_once_it_is_used():
    engine, _ = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    budget = engine.scheduler.residency.ram.budget
    engine.submit(chat("A1", "A", LONG, "list the files"))
    assert all(r.ram is None for r in engine.run_until_idle())  # nothing evicted yet: nothing shown
    for other in ("X", "Y"):  # A is evicted into the tier
        engine.submit(chat(f"{other}1", other, "hi"))
        reports = engine.run_until_idle()
    held = reports[-1].ram
    assert held is not None and held.conversations == 1 and held.restored == 0
    assert 0 < held.used_bytes <= held.budget_bytes == budget
    engine.submit(chat("a2", "A", LONG, "list the files", ("assistant", "The"), "now read one"))
    back = engine.run_until_idle()[-1].ram
    assert back is not None and back.restored == 1 and back.used_bytes < held.used_bytes


def test_with_the_tier_off_no_report_carries_it():
    engine, _ = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    engine.scheduler.residency.ram.budget = 0
    _evicted(engine, "A", "list the files")
    engine.submit(chat("a2", "A", LONG, "list the files", ("assistant", "The"), "now read one"))
    assert all(r.ram is None for r in engine.run_until_idle())
