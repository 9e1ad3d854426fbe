"""A property-based soak: hypothesis drives submit / cancel / close / fork / policy / KV-full on the
fake backend, and the engine's accounting is checked after every step (bench soak runs it longer)."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from backend.fake import FakeBackend
from backend.simulated import VirtualClock
from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.warm_store import WarmStore
from magnitude_tui.reliability.machine import POLICIES, EngineHarness

STEPS = {"n": 0}
RESTORED = {"n": 0}


class EngineMachine(RuleBasedStateMachine):
    """Small context and few slots, so admission waits, evictions, forks and preemption all happen."""

    @initialize(eog=st.sampled_from([None, 12]), n_seq_max=st.sampled_from([3, 5]))
    def start(self, eog, n_seq_max):
        backend = FakeBackend(n_ctx=700, n_seq_max=n_seq_max, n_batch=96, eog_after=eog)
        self.kv_dir = tempfile.mkdtemp(prefix="magnitude-soak-kv-")
        warm = WarmStore(self.kv_dir, layout=backend.state_layout, budget_bytes=1 << 20)
        engine = Engine(backend, policy="fixed:32", clock=VirtualClock(), coalesce_ms=0, gen_reserve=24, warm=warm)
        engine.warm.save_after_s = 0.0  # every idle conversation is saved at once: swaps restore often
        self.h = EngineHarness(engine, exact_cells=True, one_char_per_token=True)

    @rule(words=st.integers(1, 60), max_tokens=st.integers(1, 40))
    def new_conversation(self, words, max_tokens):
        self.h.submit(words, max_tokens)

    @precondition(lambda self: self.h.sessions)
    @rule(data=st.data(), words=st.integers(1, 20), max_tokens=st.integers(1, 30))
    def follow_up(self, data, words, max_tokens):
        self.h.submit(words, max_tokens, session=data.draw(st.sampled_from(sorted(self.h.sessions))))

    @precondition(lambda self: self.h.sessions)
    @rule(data=st.data(), words=st.integers(1, 10), max_tokens=st.integers(1, 20))
    def fork(self, data, words, max_tokens):
        self.h.submit(words, max_tokens, fork_from=data.draw(st.sampled_from(sorted(self.h.sessions))))

    @precondition(lambda self: self.h.live)
    @rule(data=st.data())
    def cancel(self, data):
        self.h.cancel(data.draw(st.sampled_from(self.h.live)))

    @precondition(lambda self: self.h.sessions)
    @rule(data=st.data())
    def close(self, data):
        self.h.close(data.draw(st.sampled_from(sorted(self.h.sessions))))

    @precondition(lambda self: self.h.sessions)
    @rule(data=st.data())
    def swap(self, data):
        self.h.swap(data.draw(st.sampled_from(sorted(self.h.sessions))))

    @rule(policy=st.sampled_from(POLICIES))
    def policy(self, policy):
        self.h.set_policy(policy)

    @rule()
    def kv_full(self):
        self.h.kv_full()

    @rule(n=st.integers(1, 6))
    def steps(self, n):
        for _ in range(n):
            self.h.step()
            STEPS["n"] += 1

    @invariant()
    def accounting_holds(self):
        if hasattr(self, "h"):
            self.h.check()

    def teardown(self):
        if hasattr(self, "h"):
            before = self.h.stats.steps
            self.h.finish()
            STEPS["n"] += self.h.stats.steps - before
            RESTORED["n"] += self.h.stats.restores.get("restored", 0)
            assert self.h.leaked() == (0, 0)
            self.h.engine.warm.store.close()
            shutil.rmtree(self.kv_dir, ignore_errors=True)


def test_random_operations_keep_the_books_straight_and_leave_nothing_behind():
    STEPS["n"] = 0
    RESTORED["n"] = 0
    run_state_machine_as_test(EngineMachine, settings=settings(
        max_examples=100, stateful_step_count=80, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    # The campaign's promise for CI: at least 2,000 engine steps checked.
    print(f"\n{STEPS['n']} engine steps checked")
    assert STEPS["n"] >= 2000, STEPS["n"]
    # Conversations went to disk and came back in the middle of all that, with the books straight.
    assert RESTORED["n"] >= 10, RESTORED["n"]
