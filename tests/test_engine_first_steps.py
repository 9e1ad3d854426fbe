"""Tests that the first steps after a start keep the step-time target (issue 26, defect 4)."""

from __future__ import annotations

import struct

import pytest

from backend.fake import _STATE_MAGIC, FakeBackend
from backend.simulated import PROFILES, SimulatedBackend, VirtualClock
from magnitude_tui.engine.core import Engine
from scheduler.budget import GAP_SLACK, IDLE_MERGE_MS, MIN_PREFILL_QUANTUM
from scheduler.types import Request, SamplingParams
from tests.engine_driver import close_and_assert_empty

CPU = PROFILES["cpu2core"]
SHALLOW = 1024  # positions past this cost DEEP_X times more to attend to than the calibration saw
ATTN_MS, DEEP_X = 0.3, 20.0
TARGET_MS = 100.0


def attention_ms(pos0: int, rows: int) -> float:
    """Each row at position q attends q + 1 positions; those past SHALLOW cost DEEP_X times more."""
    ms = 0.0
    for q in range(pos0, pos0 + rows):
        seen = q + 1
        ms += ATTN_MS * (min(seen, SHALLOW) + DEEP_X * max(0, seen - SHALLOW)) / 1000.0
    return ms


class DeepSurprise(SimulatedBackend):
    """The 2-core CPU, with attention that gets much dearer past SHALLOW positions (a cache that
    no longer fits): nothing a calibration near position 0 can see. It calibrates (no known costs)."""

    def __init__(self, **kw) -> None:
        super().__init__("cpu2core", **kw)
        self.known_costs = None

    def decode(self, plan):
        result = FakeBackend.decode(self, plan)
        ms = CPU.step_ms(plan.n_decode, plan.n_prefill) + sum(attention_ms(s.pos0, len(s.tokens)) for s in plan.slices)
        self._virtual.advance(ms / 1000.0)
        result.step_ms = ms
        return result

    def true_ms(self, decode_depths: list[int], prefill_pos0: int, rows: int) -> float:
        return (CPU.step_ms(len(decode_depths), rows) + sum(attention_ms(d, 1) for d in decode_depths)
                + attention_ms(prefill_pos0, rows))


def _state(tokens: list[int]) -> bytes:
    return _STATE_MAGIC + struct.pack(f"<I{len(tokens)}i", len(tokens), *tokens)


def _history(n: int, salt: int) -> list[int]:
    return [100 + (salt * 7 + i) % 500 for i in range(n)]


def test_first_steps_after_a_resume_keep_the_target_deep_in_the_context():
    """Right after a start: two conversations 3,000 tokens deep come back (a resume), one asks a
    short question and starts generating, the other pastes 900 tokens. Every step that holds the
    generating sequence's decode row stays within its bound as the true costs give it (the
    target, or the gap bound when one quantum does not fit), from the first such step on."""
    clock = VirtualClock()
    backend = DeepSurprise(clock=clock, n_ctx=16384, n_seq_max=4, n_batch=2048)
    engine = Engine(backend, policy=f"target:{TARGET_MS:g}", coalesce_ms=0)
    fitted = engine.calibrate()
    assert fitted.attn_ms < ATTN_MS * 3  # the calibration never saw the deep positions
    histories = {s: _history(3000, k) for k, s in enumerate(("a", "b"))}
    for sid, toks in histories.items():
        assert engine.scheduler.restore_session(sid, toks, _state(toks)) is None
    engine.submit(Request("qa", "a", (), SamplingParams(max_tokens=400),
                          prompt_tokens=tuple(histories["a"] + _history(8, 9))))
    engine.submit(Request("qb", "b", (), SamplingParams(max_tokens=1),
                          prompt_tokens=tuple(histories["b"] + _history(900, 11))))
    mixed, idle = [], []
    ttft_b = None
    while ttft_b is None:
        report = engine.step()
        if report is None:
            continue
        for u in report.updates:
            if u.request_id == "qb" and u.ttft_ms is not None:
                ttft_b = u.ttft_ms
        (mixed if report.decode_rows else idle).append(report)
    assert mixed, "the long prompt never shared a step with the generating sequence"
    for r in mixed:
        # The bound the policy aims at with the true costs: one decode row ~3,000 deep.
        decode_only = backend.true_ms([3000], 3000, 0)
        floor = backend.true_ms([3000], 3000, MIN_PREFILL_QUANTUM)
        bound = max(TARGET_MS, (1 + GAP_SLACK) * decode_only, floor)
        assert r.step_ms <= 1.3 * bound, (r.step, r.step_ms, r.prefill_rows, bound)
    for r in idle:
        assert r.step_ms <= 1.3 * IDLE_MERGE_MS, (r.step, r.step_ms, r.prefill_rows)
    engine.cancel("qa")
    engine.run_until_idle()
    close_and_assert_empty(engine, "a", "b")


def test_a_profile_with_exact_costs_is_not_ramped():
    backend = SimulatedBackend("cpu2core", n_ctx=8192)
    engine = Engine(backend, policy="target:50", coalesce_ms=0)
    engine.calibrate()
    assert not engine.scheduler.ramp.armed


def test_the_ramp_widens_after_steps_that_ran_as_predicted_and_narrows_after_an_overrun():
    from scheduler.ramp import PromptRamp

    ramp = PromptRamp(n_batch=512)
    assert ramp.cap(300) == 300  # off until armed
    ramp.arm()
    assert ramp.cap(300) == MIN_PREFILL_QUANTUM
    ramp.observe(16, 40.0, 38.0, 50.0)
    ramp.observe(32, 48.0, 45.0, 50.0)
    assert ramp.cap(300) == 64
    ramp.observe(10, 500.0, 45.0, 50.0)  # the cap did not bind: no evidence either way
    assert ramp.cap(300) == 64
    ramp.observe(64, 300.0, 50.0, 50.0)  # six times its prediction: the model was wrong there
    assert ramp.cap(300) == 32
    for _ in range(6):
        ramp.observe(ramp.limit, 10.0, 10.0, 50.0)
    assert ramp.cap(10_000) == 512


@pytest.mark.slow
def test_real_model_first_steps_after_calibration_start_at_one_quantum_and_keep_their_bound(clean_llama):
    from tests.engine_driver import Driver

    engine = Engine(clean_llama, policy="target:200", coalesce_ms=0)
    engine.calibrate()
    assert engine.scheduler.ramp.armed
    d = Driver(engine)
    d.submit("gen", "g", "Write a very long story about a dragon who learns to bake bread.", max_tokens=400)
    d.run_until(lambda: len(d.seen["gen"].token_times) >= 2)
    facts = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(90))
    d.submit("new", "n", facts, max_tokens=2)
    d.run_until(lambda: d.seen["new"].done)
    prompt_steps = [r for r in d.reports if r.prefill_rows]
    # The very first prompt steps after the calibration: one quantum, then at most twice that
    # (step times on a shared 2-core machine are not asserted: the load there swings them 10x).
    assert prompt_steps[0].prefill_rows <= MIN_PREFILL_QUANTUM
    assert prompt_steps[1].prefill_rows <= 2 * MIN_PREFILL_QUANTUM
    assert all(r.outcome.value == "ok" for r in d.reports)
    engine.cancel("gen")
    d.run_until_done("gen", "new")
    close_and_assert_empty(engine, "g", "n")
