"""Warm resume on the real model: a conversation restored from disk continues as if never stopped."""

from __future__ import annotations

import pytest

from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.events import RestoreOutcome
from magnitude_tui.engine.warm_store import WarmStore
from scheduler.types import Message, Request, SamplingParams

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
FACTS = " ".join(f"Fact {i}: the keeper of lighthouse {i} lit the lamp at {i % 12 + 1} o'clock." for i in range(14))


def _turn(engine: Engine, rid: str, messages: list[Message]):
    engine.submit(Request(rid, "s1", tuple(messages), GREEDY))
    updates = [u for r in engine.run_until_idle() for u in r.updates if u.request_id == rid]
    return "".join(u.text_delta for u in updates), updates[-1]


def _empty(engine: Engine) -> None:
    engine.close_session("s1")
    engine.run_until_idle()
    assert engine.is_empty(), engine.leaks()


def test_a_restored_conversation_reuses_its_history_and_gives_the_same_greedy_reply(clean_llama, tmp_path):
    backend = clean_llama
    store = WarmStore(tmp_path / "kv", layout=backend.state_layout, budget_bytes=1 << 30)
    first = Engine(backend, policy="fixed:512", warm=store)
    history = [Message("user", f"{FACTS} Which keeper lit the lamp at noon?")]
    reply, _ = _turn(first, "t1", history)
    history.append(Message("assistant", reply))
    first.shutdown()  # the app quits: the idle conversation is saved
    follow_up = history + [Message("user", "And at one o'clock?")]
    expected, uninterrupted = _turn(first, "t2", follow_up)
    _empty(first)

    resumed = Engine(backend, policy="fixed:512",
                     warm=WarmStore(tmp_path / "kv", layout=backend.state_layout, budget_bytes=1 << 30))
    resumed.restore_session("s1", history)
    resumed.step()
    [notice] = resumed.take_notices()
    assert notice.outcome is RestoreOutcome.RESTORED, notice
    assert notice.tokens > 300 and resumed.leaks() == []
    got, warm = _turn(resumed, "t2", follow_up)
    # The whole history comes from the restored cells; only the new turn is prefilled.
    assert warm.cached_tokens == notice.tokens == uninterrupted.cached_tokens
    assert warm.prompt_total - warm.cached_tokens < 20
    # The same cells, bit for bit, at the same positions: the same greedy reply.
    assert got == expected
    _empty(resumed)
