"""A random workload against the engine: turns, forks, cancels, closes and injected faults."""

from __future__ import annotations

import random

import pytest

from backend.fake import FakeBackend
from backend.protocol import DecodeOutcome
from backend.simulated import VirtualClock
from magnitude_tui.engine.core import Engine
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.engine_driver import close_and_assert_empty


@pytest.mark.parametrize("policy", ["prefill-first", "fixed:16", "target:40"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_workload_never_breaks_a_contract_or_leaks(policy, seed):
    rng = random.Random(seed)
    backend = FakeBackend(n_ctx=1500, n_seq_max=5, n_batch=96, eog_after=rng.choice([None, 20]))
    clock = VirtualClock()
    engine = Engine(backend, policy=policy, clock=clock, coalesce_ms=2, gen_reserve=24)
    history: dict[str, list[Message]] = {}
    texts: dict[str, str] = {}
    last: dict[str, object] = {}
    n = 0

    def record(report):
        if report is None:
            return
        assert report.kv_used <= report.kv_total
        assert report.decode_rows + report.prefill_rows <= report.budget
        for u in report.updates:
            assert u.error is None or "internal" not in u.error, u.error
            texts[u.request_id] = texts.get(u.request_id, "") + u.text_delta
            last[u.request_id] = u
            if u.phase is Phase.DONE and u.done_reason in (DoneReason.STOP, DoneReason.LENGTH):
                history[u.session_id].append(Message("assistant", texts[u.request_id]))

    for _ in range(600):
        r = rng.random()
        if r < 0.08:
            n += 1
            sid = rng.choice([*history, f"s{n}"]) if history and rng.random() < 0.5 else f"s{n}"
            msgs = history.setdefault(sid, [Message("system", "agent " * rng.randint(1, 40))])
            msgs.append(Message("user", "do " * rng.randint(1, 30)))
            fork = rng.choice([None, *history]) if rng.random() < 0.3 else None
            engine.submit(Request(f"r{n}", sid, tuple(msgs), SamplingParams(max_tokens=rng.randint(1, 40)),
                                  fork_from=fork))
        elif r < 0.10 and n:
            engine.cancel(f"r{rng.randint(1, n)}")
        elif r < 0.11 and history:
            engine.close_session(rng.choice(list(history)))
        elif r < 0.13:
            backend.fail_next(rng.choice([DecodeOutcome.NO_KV_SLOT, DecodeOutcome.ABORTED]))
        record(engine.step())
        clock.advance(0.001)
    for report in engine.run_until_idle():
        record(report)
    assert all(u.phase is Phase.DONE for u in last.values())
    # Resident conversations (ended or cancelled) hold exactly their committed tokens, nothing staged.
    for session in engine.scheduler.sessions.values():
        assert session.is_idle and backend.kv_tokens(session.seq_id) == session.tokens
    close_and_assert_empty(engine, *history)
    assert backend.samplers == {} and backend.kv_cells_used() == 0
