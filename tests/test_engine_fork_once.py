"""Tests that subagents forked over a parent's uncached tail evaluate that tail once (issue 26, defect 5)."""

from __future__ import annotations

import pytest

from backend.simulated import SimulatedBackend
from magnitude_tui.engine.core import Engine
from scheduler.types import Message, Phase, Priority, Request, SamplingParams
from tests.engine_driver import close_and_assert_empty

CACHED, TAIL, TASK, N = 540, 1150, 20, 3


def _toks(n: int, salt: int) -> list[int]:
    return [100 + (salt * 31 + i * 7) % 900 for i in range(n)]


def _burst(engine: Engine, parent: list[int], tail: list[int], n: int = N, priority=Priority.BACKGROUND):
    """The parent's turn leaves `parent` resident; then `n` children fork from it, each with the
    parent's context plus `tail` (answers posted back since, never evaluated) and its own task."""
    engine.submit(Request("p", "p", (), SamplingParams(max_tokens=1), prompt_tokens=tuple(parent)))
    engine.run_until_idle()
    for i in range(n):
        engine.submit(Request(f"c{i}", f"c{i}", (), SamplingParams(max_tokens=4), fork_from="p",
                              prompt_tokens=tuple(parent + tail + _toks(TASK, 50 + i)), priority=priority))
    finals, prefill_rows, reasons = {}, 0, set()
    for report in engine.run_until_idle():
        prefill_rows += report.prefill_rows
        for u in report.updates:
            if u.phase is Phase.DONE:
                finals[u.request_id] = u
            if u.waiting_reason:
                reasons.add(u.waiting_reason)
    return finals, prefill_rows, reasons


def test_a_burst_over_an_uncached_tail_evaluates_the_tail_once():
    backend = SimulatedBackend("cpu2core", n_ctx=16384, n_seq_max=8, n_batch=2048)
    engine = Engine(backend, policy="fixed:100", coalesce_ms=5)  # chunks that end inside the tail
    finals, prefill_rows, reasons = _burst(engine, _toks(CACHED, 1), _toks(TAIL, 2))
    assert len(finals) == N and all(u.error is None for u in finals.values())
    # The tail once and each child's task: not the tail once per child.
    assert prefill_rows == TAIL + N * TASK, prefill_rows
    cached = sorted(u.cached_tokens for u in finals.values())
    assert cached[0] == CACHED  # the first child brings the context up to date...
    assert all(c >= CACHED + TAIL for c in cached[1:])  # ...the others copy it
    assert any("prompt tokens they share" in r for r in reasons)
    # Evaluated once, the tail gives every child its first token sooner than three copies would.
    ttfts = sorted(u.ttft_ms for u in finals.values())
    alone = backend.profile.step_ms(0, TAIL + TASK)
    assert ttfts[-1] < 1.5 * alone, ttfts
    close_and_assert_empty(engine, "p", *(f"c{i}" for i in range(N)))


def test_a_person_never_waits_behind_an_agents_prefill_of_a_shared_prefix():
    """Sharing waits only for a request of the same class or higher: a person's turn that shares
    a long prefix with a background child is not made to wait for that child's slower rows."""
    backend = SimulatedBackend("cpu2core", n_ctx=16384, n_seq_max=8, n_batch=2048)
    engine = Engine(backend, policy="target:50", coalesce_ms=5)
    parent, tail = _toks(CACHED, 1), _toks(TAIL, 2)
    engine.submit(Request("p", "p", (), SamplingParams(max_tokens=1), prompt_tokens=tuple(parent)))
    engine.run_until_idle()
    engine.submit(Request("c0", "c0", (), SamplingParams(max_tokens=4), fork_from="p",
                          prompt_tokens=tuple(parent + tail + _toks(TASK, 50)), priority=Priority.BACKGROUND))
    engine.submit(Request("me", "me", (), SamplingParams(max_tokens=4), fork_from="p",
                          prompt_tokens=tuple(parent + tail + _toks(TASK, 60)), priority=Priority.INTERACTIVE))
    reasons = {u.waiting_reason for r in engine.run_until_idle() for u in r.updates
               if u.request_id == "me" and u.waiting_reason}
    assert not any("share" in r for r in reasons), reasons
    close_and_assert_empty(engine, "p", "c0", "me")


@pytest.mark.slow
def test_real_model_burst_copies_the_tail_its_first_child_evaluated(clean_llama):
    engine = Engine(clean_llama, policy="target:200", coalesce_ms=5)
    engine.calibrate()
    history = [Message("user", "Summarise the facts below."),
               Message("assistant", " ".join(f"Fact {i} is that {i} plus {i} is {2 * i}." for i in range(20)))]
    answers = [Message("user", " ".join(f"Answer {i}: the square of {i} is {i * i}." for i in range(30)))]
    engine.submit(Request("p", "p", tuple(history), SamplingParams(max_tokens=1)))
    engine.run_until_idle()
    for i in range(N):
        engine.submit(Request(f"c{i}", f"c{i}", tuple(history + answers + [Message("user", f"Task {i}: count to {i + 3}.")]),
                              SamplingParams(max_tokens=4), fork_from="p", priority=Priority.BACKGROUND))
    finals, prefill_rows = {}, 0
    for report in engine.run_until_idle():
        prefill_rows += report.prefill_rows
        finals.update((u.request_id, u) for u in report.updates if u.phase is Phase.DONE)
    assert all(finals[f"c{i}"].error is None for i in range(N))
    totals = {u.prompt_total - u.cached_tokens for u in finals.values()}
    tail = max(totals)  # the first child: the answers and its task
    assert prefill_rows < tail + N * 40, (prefill_rows, totals)
    assert sum(1 for u in finals.values() if u.prompt_total - u.cached_tokens < 40) == N - 1
    close_and_assert_empty(engine, "p", *(f"c{i}" for i in range(N)))
