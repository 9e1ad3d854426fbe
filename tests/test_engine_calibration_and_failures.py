"""Engine on the fake backend: calibration of the step-cost model (run at load), and failure
handling: bad requests, a batch the backend rejects, no KV slot, KV exhaustion, fail_all."""

from __future__ import annotations

import pytest

from backend.fake import FakeBackend
from backend.protocol import DecodeOutcome, DecodeResult, PlanError
from magnitude_tui.engine.events import RejectReason
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text


class _TimedFake(FakeBackend):
    """A fake whose steps take a known time, to check calibration's fit."""

    def decode(self, plan) -> DecodeResult:
        result = super().decode(plan)
        result.step_ms = 3.0 + 0.5 * plan.n_decode + 25.0 * plan.n_prefill  # a slow CPU
        return result


def test_calibrate_fits_the_cost_model_and_leaves_nothing_behind():
    engine, backend = engine_for(_TimedFake())
    params = engine.calibrate()
    assert params.fixed_ms == pytest.approx(3.0, rel=0.2)
    assert params.decode_ms == pytest.approx(0.5, rel=0.2)
    assert params.prefill_ms == pytest.approx(25.0, rel=0.05)
    assert engine.cost == params
    assert_clean(engine)


def test_bad_requests_fail_alone_with_clear_errors():
    engine, _ = engine_for(FakeBackend(n_ctx=512, eog_after=5))
    engine.submit(chat("ok", "s0", "fine"))
    engine.submit(Request("role", "s1", (Message("wizard", "x"),)))
    engine.submit(chat("huge", "s2", "y" * 600))
    engine.submit(Request("vocab", "s3", (), prompt_tokens=(5, 10**9)))
    engine.submit(chat("zero", "s4", "x", max_tokens=0))
    engine.submit(Request("empty", "s5", (), prompt_tokens=()))
    engine.submit(chat("ok", "s6", "duplicate"))
    reports = engine.run_until_idle()
    ups = by_request(reports)
    errors = {rid: u.error for rid, us in ups.items() for u in us if u.done_reason is DoneReason.ERROR}
    assert "unknown chat role" in errors["role"]
    assert "larger context" in errors["huge"]
    assert "vocabulary" in errors["vocab"]
    assert "max_tokens" in errors["zero"]
    assert "empty" in errors["empty"]
    # The second "ok" is refused apart from the first (a Rejection, not an update under its id).
    [dup] = [r for report in reports for r in report.rejected]
    assert dup.reason is RejectReason.DUPLICATE_ID and dup.session_id == "s6" and "already in use" in dup.message
    assert "ok" not in errors
    assert ups["ok"][-1].done_reason is DoneReason.STOP  # the first "ok" was not disturbed
    assert_clean(engine, "s0")


def test_a_rejected_batch_fails_its_requests_and_the_engine_goes_on():
    engine, backend = engine_for()
    real = backend.decode
    calls = []

    def broken(plan):
        calls.append(plan)
        if len(calls) == 1:
            raise PlanError("position gap")
        return real(plan)

    backend.decode = broken
    engine.submit(chat("a", "sa", "hi"))
    first = by_request(engine.run_until_idle())["a"][-1]
    assert first.done_reason is DoneReason.ERROR and "position gap" in first.error
    engine.submit(chat("b", "sb", "hi", max_tokens=3))
    assert by_request(engine.run_until_idle())["b"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "sb")


def test_no_kv_slot_from_the_backend_is_reported_as_the_step_outcome():
    engine, backend = engine_for()
    engine.submit(chat("a", "sa", "hi", max_tokens=3))
    backend.fail_next(DecodeOutcome.NO_KV_SLOT)
    report = engine.step()
    assert report.outcome is DecodeOutcome.NO_KV_SLOT
    assert by_request(engine.run_until_idle())["a"][-1].generated == 3
    assert_clean(engine, "sa")


def test_kv_exhaustion_preempts_and_recomputes_without_losing_shown_text():
    backend = FakeBackend(n_ctx=200, n_batch=64)
    engine, _ = engine_for(backend, policy="fixed:32", gen_reserve=4)
    for i in range(3):
        engine.submit(Request(f"r{i}", f"s{i}", (), SamplingParams(max_tokens=60),
                              prompt_tokens=tuple(range(100, 140))))
    reports = engine.run_until_idle()
    ups = by_request(reports)
    assert any(r.outcome is DecodeOutcome.NO_KV_SLOT for r in reports)
    preempted = [rid for rid, us in ups.items() if any("preempted" in (u.waiting_reason or "") for u in us)]
    assert preempted
    for rid, us in ups.items():
        assert us[-1].done_reason is DoneReason.LENGTH and us[-1].generated == 60
        assert len(text(us)) == 60 == sum(u.new_tokens for u in us)
    for rid in preempted:
        us = ups[rid]
        cut = next(i for i, u in enumerate(us) if "preempted" in (u.waiting_reason or ""))
        shown = text(us[: cut + 1])
        assert shown and text(us).startswith(shown)
        assert us[cut].phase is Phase.QUEUED and us[cut].generated == len(shown)
    assert_clean(engine, "s0", "s1", "s2")


def fail_all(engine, message: str):
    """End every live request with an error and report it (what a dying backend would need; the
    engine itself never does this: its worker client fails what was live when the worker dies)."""
    for seq in list(engine._intake.live.values()):
        engine.scheduler.finish(seq, DoneReason.ERROR, message)
    engine._intake._intake = []  # taken in, not tokenized yet
    return engine._reporter.report(None, None, engine._clock(), 0.0)


def test_fail_all_ends_every_live_request_with_the_reason():
    engine, _ = engine_for()
    engine.submit(chat("a", "sa", "hi"))
    engine.submit(chat("b", "sb", "hi"))
    engine.step()
    report = fail_all(engine, "the engine is shutting down")
    assert {u.request_id: u.error for u in report.updates} == {
        "a": "the engine is shutting down", "b": "the engine is shutting down"}
    assert_clean(engine)
