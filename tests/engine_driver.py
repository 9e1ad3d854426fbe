"""Drives an in-process Engine over a real or fake backend and records what each request saw; also
the small helpers the fake-backend engine tests share (build an engine, a chat request, group and
join updates per request, check nothing leaked)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from backend.fake import FakeBackend
from backend.simulated import VirtualClock
from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.events import SeqUpdate, StepReport
from scheduler.types import Message, Phase, Request, SamplingParams


@dataclass
class Seen:
    """Everything one request reported, in order."""

    updates: list[SeqUpdate] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # engine clock at each step with new tokens
    text: str = ""

    @property
    def last(self) -> SeqUpdate:
        return self.updates[-1]

    @property
    def done(self) -> bool:
        return bool(self.updates) and self.updates[-1].phase is Phase.DONE

    def gaps_ms(self, t0: float, t1: float) -> list[float]:
        """Inter-token gaps of the tokens that arrived inside [t0, t1] (the one before t0 counts)."""
        ts = self.token_times
        out = []
        for a, b in zip(ts, ts[1:]):
            if b >= t0 and a <= t1:
                out.append((b - a) * 1000.0)
        return out


class Driver:
    def __init__(self, engine):
        self.engine = engine
        self.seen: dict[str, Seen] = {}
        self.reports: list[StepReport] = []

    def submit(self, rid: str, session: str, text: str | list[Message] | None = None, *, max_tokens: int = 32,
               fork_from: str | None = None, prompt_tokens=None, temperature: float = 0.0) -> str:
        msgs = tuple(text) if isinstance(text, list) else ((Message("user", text),) if text else ())
        self.seen.setdefault(rid, Seen())
        self.engine.submit(Request(rid, session, msgs, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                                   fork_from=fork_from,
                                   prompt_tokens=tuple(prompt_tokens) if prompt_tokens is not None else None))
        return rid

    def step(self) -> StepReport | None:
        report = self.engine.step()
        if report is None:
            hint = self.engine.wait_hint()
            if hint:
                time.sleep(min(hint, 0.01))
            return None
        self.reports.append(report)
        for u in report.updates:
            s = self.seen.setdefault(u.request_id, Seen())
            s.updates.append(u)
            s.text += u.text_delta
            if u.new_tokens:
                s.token_times.append(report.t)
        return report

    def run_until(self, cond, timeout: float = 300.0) -> None:
        t_end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > t_end:
                raise TimeoutError("engine did not reach the expected state in time")
            self.step()

    def run_until_done(self, *rids: str, timeout: float = 300.0) -> None:
        self.run_until(lambda: all(self.seen[r].done for r in rids), timeout)


def engine_for(backend=None, policy="fixed:64", coalesce_ms=0.0, clock=None, **kw):
    backend = backend or FakeBackend()
    # A fake backend keeps wall time; these tests want the virtual kind (no real waiting).
    clock = clock or (backend.clock if isinstance(backend.clock, VirtualClock) else VirtualClock())
    return Engine(backend, policy=policy, clock=clock, coalesce_ms=coalesce_ms, **kw), backend


def chat(rid, session, *messages, max_tokens=256, fork_from=None):
    msgs = tuple(Message(*m) if isinstance(m, tuple) else Message("user", m) for m in messages)
    return Request(rid, session, msgs, SamplingParams(max_tokens=max_tokens), fork_from=fork_from)


def by_request(reports):
    out = {}
    for r in reports:
        for u in r.updates:
            out.setdefault(u.request_id, []).append(u)
    return out


def text(updates):
    return "".join(u.text_delta for u in updates)


def close_and_assert_empty(engine, *sessions):
    """Close `sessions`, run the engine until it is idle, and fail with its leaks if it still
    holds a sequence, a KV cell or a request (any backend)."""
    for s in sessions:
        engine.close_session(s)
    engine.run_until_idle()
    assert engine.is_empty(), engine.leaks()


def assert_clean(engine, *sessions):
    """close_and_assert_empty, and on the fake backend no sampler left behind either."""
    close_and_assert_empty(engine, *sessions)
    assert engine.backend.samplers == {}
