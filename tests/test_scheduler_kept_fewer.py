"""A backend may keep fewer positions than asked (a sliding-window model's window layers lose
cells a shorter prefix needs; backend/llama_backend.py empties such a sequence). The scheduler's
ledger reads back what is held after every keep, copy and load, and a running sequence evaluates
again what its KV lost, as after a preemption. Before, only binding, retiring and restoring read
it back: a step rolled back after its rows were partly written (the split step's second call
failing) left the ledger ahead of the KV, and the request ended in "internal error: the planned
batch broke a native contract"."""

from __future__ import annotations

from backend.fake import FakeBackend
from backend.protocol import DecodeOutcome, DecodeResult
from scheduler.types import DoneReason, Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, engine_for, text

WINDOW = 4


class _Windowed(FakeBackend):
    """Keeping a prefix more than WINDOW positions short of a sequence's end empties it (what
    llama_backend does when the window layers cannot continue from there); `partial_fail` makes
    the next decode write its rows and then fail, as a split step whose second call finds no slot."""

    partial_fail = False

    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None:
        if 0 < n_tokens < self.kv_pos_max(seq_id) + 1 - WINDOW:
            n_tokens = 0
        super().kv_keep_prefix(seq_id, n_tokens)

    def decode(self, plan) -> DecodeResult:
        result = super().decode(plan)
        if self.partial_fail and result.outcome is DecodeOutcome.OK and plan.n_prefill > WINDOW:
            self.partial_fail = False
            return DecodeResult(DecodeOutcome.NO_KV_SLOT, 0.0, {}, 1)
        return result


def _request(rid: str, prompt: tuple[int, ...], max_tokens: int = 6) -> Request:
    return Request(rid, f"s-{rid}", (), SamplingParams(max_tokens=max_tokens), prompt_tokens=prompt)


def test_a_rolled_back_step_whose_prefix_the_backend_lost_is_evaluated_again():
    backend = _Windowed(n_ctx=1024)
    engine, _ = engine_for(backend, policy="fixed:16")
    engine.submit(_request("a", tuple(range(100, 140))))
    engine.step()  # its first 16 prompt rows
    backend.partial_fail = True  # the next chunk's rows are written, then the step fails
    ups = by_request(engine.run_until_idle())["a"]
    assert ups[-1].error is None and ups[-1].done_reason is DoneReason.LENGTH
    assert ups[-1].generated == 6 and len(text(ups)) == 6
    assert not engine.scheduler.kv.mismatches()
    assert_clean(engine, "s-a")


def test_the_same_reply_as_without_the_loss():
    def reply(windowed: bool) -> str:
        backend = _Windowed(n_ctx=1024) if windowed else FakeBackend(n_ctx=1024)
        engine, _ = engine_for(backend, policy="fixed:16")
        engine.submit(_request("a", tuple(range(100, 140))))
        engine.step()
        backend.partial_fail = windowed
        return text(by_request(engine.run_until_idle())["a"])

    assert reply(True) == reply(False)


def test_an_idle_conversation_trimmed_after_its_step_keeps_only_what_the_kv_holds():
    backend = _Windowed(n_ctx=1024)
    engine, _ = engine_for(backend, policy="fixed:64")
    engine.submit(_request("a", tuple(range(100, 120)), max_tokens=3))
    engine.run_until_idle()
    ledger = engine.scheduler.kv
    slot = engine.scheduler.residency.sessions["s-a"].seq_id
    assert ledger.keep_prefix(slot, 5) == 0  # far from the end: the window cannot continue from 5
    assert ledger.positions(slot) == 0 and not ledger.mismatches()
