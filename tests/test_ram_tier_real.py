"""The host-memory KV tier on the real model: a conversation evicted for another's slot comes back
from host memory, and its next reply is the one it would have had if it had never left."""

from __future__ import annotations

import pytest

from magnitude_tui.engine.core import Engine
from scheduler.types import Message, Request, SamplingParams
from tests.needs import need_real_model

SYSTEM = "You are a careful agent. You read files and answer in one short sentence. " * 6
TURN_1 = "Which file holds the scheduler's planner?"
TURN_2 = "And which one holds the host-memory tier?"


def _turn(rid: str, *messages: tuple[str, str]) -> Request:
    return Request(rid, "A", tuple(Message(*m) for m in messages), SamplingParams(temperature=0.0, max_tokens=12))


def _done(reports, rid: str):
    ups = [u for r in reports for u in r.updates if u.request_id == rid]
    assert ups and ups[-1].error is None, ups[-1:]
    return ups[-1], "".join(u.text_delta for u in ups)


def _second_turn(backend, evict: bool, ram_on: bool) -> tuple[object, str, object]:
    """A's first turn, then (with `evict`) two other conversations take both slots, then A's second
    turn; returns its last update, its text and the engine's host-memory tier."""
    engine = Engine(backend, policy="fixed:64", ram_bytes=(64 << 20) if ram_on else 0)
    engine.submit(_turn("a1", ("system", SYSTEM), ("user", TURN_1)))
    _, first = _done(engine.run_until_idle(), "a1")
    if evict:
        for other in ("X", "Y"):
            engine.submit(Request(f"{other}1", other, (Message("user", f"Say {other}."),),
                                  SamplingParams(temperature=0.0, max_tokens=4)))
            engine.run_until_idle()
        assert "A" not in engine.scheduler.sessions  # evicted, least recently used
    engine.submit(_turn("a2", ("system", SYSTEM), ("user", TURN_1), ("assistant", first), ("user", TURN_2)))
    last, text = _done(engine.run_until_idle(), "a2")
    for sid in ("A", "X", "Y"):
        engine.close_session(sid)
    engine.run_until_idle()
    assert engine.is_empty()
    return last, text, engine.scheduler.residency.ram


@pytest.mark.slow
def test_an_evicted_conversation_restored_from_host_memory_answers_as_if_it_never_left():
    need_real_model()
    from backend.llama_backend import LlamaBackend

    backend = LlamaBackend.load(device="cpu", n_ctx=2048, n_seq_max=2, n_batch=512, n_ubatch=512)
    try:
        stayed, stayed_text, _ = _second_turn(backend, evict=False, ram_on=True)
        restored, restored_text, ram = _second_turn(backend, evict=True, ram_on=True)
        cold, cold_text, _ = _second_turn(backend, evict=True, ram_on=False)
    finally:
        backend.close()
    assert ram.restored_count == 1 and ram.saved_count >= 1
    history = stayed.cached_tokens
    assert history > 100 and restored.cached_tokens == history  # the whole history came back
    assert cold.cached_tokens < 16  # without the tier the history is evaluated again (a template's
    # opening tokens may be shared with another conversation)
    assert restored_text == stayed_text == cold_text and restored_text.strip()
