"""Provides EngineHarness: operations on an in-process Engine with its accounting checked after every step.

The property-based test (hypothesis drives the operations) and `bench soak` (a seeded random walk
of 100,000 of them) share it, so the long run checks exactly what CI checks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from backend.fake import FakeBackend
from backend.protocol import DecodeOutcome
from magnitude_tui.engine.events import StepReport
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams

POLICIES = ("prefill-first", "fixed:16", "fixed:64", "target:30", "target:200")


class InvariantViolation(AssertionError):
    """The engine's accounting disagrees with the backend, or a request saw something impossible."""


@dataclass
class RequestLog:
    session_id: str
    text: str = ""
    new_tokens: int = 0
    updates: int = 0
    last_phase: Phase | None = None
    done_reason: DoneReason | None = None
    generated: int = 0
    error: str | None = None


@dataclass
class HarnessStats:
    ops: int = 0
    steps: int = 0
    submitted: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # done reason -> count
    max_kv_used: int = 0
    preemptions: int = 0
    lost_tokens: int = 0  # tokens generated but never shown, or shown twice
    restores: dict[str, int] = field(default_factory=dict)  # warm-resume outcome -> count


class EngineHarness:
    """Random-walk operations on one Engine: submit (new conversation, follow-up turn, fork),
    cancel, close, policy switch, an injected "no KV slot" step, and steps.

    After every step `check()` demands: the scheduler's KV ledger equals the backend's cells
    (distinct cells where the backend can count them, per-sequence positions always); free plus
    held slots equal n_seq_max, each running sequence on its own slot holding exactly its
    committed rows; a report never exceeds its budget or the cache. Every request's updates stop
    after its `done`, and the tokens it was told about equal its generated count (no token shown
    twice or lost, preemptions included). `finish()` closes everything and demands an empty engine.
    """

    def __init__(self, engine, *, exact_cells: bool, one_char_per_token: bool = False) -> None:
        self.engine = engine
        self.backend = engine.backend
        self.exact_cells = exact_cells  # the backend counts distinct cells (fake): compare totals
        self.one_char_per_token = one_char_per_token
        self.sessions: dict[str, list[Message]] = {}
        self.requests: dict[str, RequestLog] = {}
        self.live: list[str] = []
        self.stats = HarnessStats()
        self._n = 0

    # ---- operations --------------------------------------------------------------------------

    def submit(self, words: int, max_tokens: int, *, session: str | None = None,
               fork_from: str | None = None) -> str:
        """A new conversation (session None), a follow-up turn, or a fork of `fork_from`."""
        self._n += 1
        rid = f"r{self._n}"
        if session is None or session not in self.sessions:
            session = f"s{self._n}"
            self.sessions[session] = [Message("system", "agent " * max(1, words // 3))]
        busy = any(self.requests[r].session_id == session for r in self.live)
        history = list(self.sessions[session])
        if fork_from is not None and fork_from in self.sessions and fork_from != session:
            history = list(self.sessions[fork_from])
        history.append(Message("user", "do " * max(1, words)))
        if not busy:
            self.sessions[session] = history
        self.requests[rid] = RequestLog(session)
        self.live.append(rid)
        known = fork_from in self.sessions if fork_from is not None else True
        self.engine.submit(Request(rid, session, tuple(history), SamplingParams(max_tokens=max_tokens),
                                   fork_from=fork_from if known else None))
        self.stats.submitted += 1
        self.stats.ops += 1
        return rid

    def cancel(self, rid: str) -> None:
        self.engine.cancel(rid)
        self.stats.ops += 1

    def close(self, session: str) -> None:
        self.engine.close_session(session)
        self.sessions.pop(session, None)
        self.stats.ops += 1

    def swap(self, session: str) -> None:
        """The conversation's KV leaves memory and comes back from its saved state (warm resume)
        as far as its history still matches it, or it stays cold (an engine with a WarmStore)."""
        self.engine.close_session(session)
        self.engine.restore_session(session, self.sessions[session])
        self.stats.ops += 1

    def set_policy(self, policy: str) -> None:
        self.engine.set_policy(policy)
        self.stats.ops += 1

    def kv_full(self) -> None:
        """The next native step finds no KV slot (as a fragmented or full cache would)."""
        self.backend.fail_next(DecodeOutcome.NO_KV_SLOT)
        self.stats.ops += 1

    def step(self) -> StepReport | None:
        report = self.engine.step()
        for notice in self.engine.take_notices():
            self.stats.restores[notice.outcome.value] = self.stats.restores.get(notice.outcome.value, 0) + 1
        self.stats.steps += 1
        self.stats.ops += 1
        if report is not None:
            self._record(report)
        self.check(report)
        return report

    # ---- a random walk (bench soak) ----------------------------------------------------------

    def random_op(self, rng: random.Random) -> None:
        r = rng.random()
        if r < 0.10:
            self.submit(rng.randint(1, 40), rng.randint(1, 40))
        elif r < 0.14 and self.sessions:
            self.submit(rng.randint(1, 20), rng.randint(1, 30), session=rng.choice(list(self.sessions)))
        elif r < 0.17 and self.sessions:
            self.submit(rng.randint(1, 10), rng.randint(1, 20), fork_from=rng.choice(list(self.sessions)))
        elif r < 0.20 and self.live:
            self.cancel(rng.choice(self.live))
        elif r < 0.215 and self.sessions:
            self.close(rng.choice(list(self.sessions)))
        elif r < 0.225:
            self.set_policy(rng.choice(POLICIES))
        elif r < 0.24 and isinstance(self.backend, FakeBackend):
            self.kv_full()
        elif r < 0.25 and self.sessions and self.engine.warm is not None:
            self.swap(rng.choice(list(self.sessions)))
        else:
            self.step()

    # ---- checks ------------------------------------------------------------------------------

    def check(self, report: StepReport | None = None) -> None:
        problems = self.problems(report)
        if problems:
            raise InvariantViolation("; ".join(problems))

    def problems(self, report: StepReport | None = None) -> list[str]:
        s = self.engine.scheduler
        res = s.residency
        out = list(s.kv.mismatches())
        if self.exact_cells and s.kv.cells_used() != self.backend.kv_cells_used():
            out.append(f"ledger holds {s.kv.cells_used()} cells, the backend {self.backend.kv_cells_used()}")
        held = {x.seq_id for x in s.sessions.values() if x.seq_id is not None}
        free = res.free_slots()
        if len(free) + len(held) != s.n_seq_max or held & set(free):
            out.append(f"slots: {len(free)} free + {len(held)} held != n_seq_max {s.n_seq_max}")
        slots = [q.seq_id for q in s.running]
        if len(set(slots)) != len(slots) or None in slots:
            out.append(f"running sequences share or lack slots: {slots}")
        for q in s.running:
            session = s.sessions.get(q.session_id)
            if session is None or session.seq_id != q.seq_id or session.live is not q:
                out.append(f"{q!r} runs on a slot its conversation does not hold")
            elif s.kv.positions(q.seq_id) != q.num_computed:
                out.append(f"{q!r}: KV holds {s.kv.positions(q.seq_id)} rows, {q.num_computed} committed")
        if report is not None:
            if report.decode_rows + report.prefill_rows > report.budget:
                out.append(f"step {report.step}: {report.decode_rows + report.prefill_rows} rows over "
                           f"budget {report.budget}")
            if report.kv_used > report.kv_total:
                out.append(f"step {report.step}: {report.kv_used} cells used of {report.kv_total}")
        return out

    def _record(self, report: StepReport) -> None:
        self.stats.max_kv_used = max(self.stats.max_kv_used, report.kv_used)
        for r in report.rejected:
            raise InvariantViolation(f"a well-formed submit was rejected: {r}")
        for u in report.updates:
            log = self.requests.get(u.request_id)
            if log is None:
                raise InvariantViolation(f"an update for a request never submitted: {u.request_id}")
            if log.last_phase is Phase.DONE:
                raise InvariantViolation(f"{u.request_id} reported {u.phase.value} after done")
            if u.error and "internal" in u.error:
                raise InvariantViolation(f"{u.request_id}: {u.error}")
            log.updates += 1
            log.last_phase = u.phase
            log.text += u.text_delta
            log.new_tokens += u.new_tokens
            log.generated = u.generated
            if u.waiting_reason and u.waiting_reason.startswith("preempted"):
                self.stats.preemptions += 1
            if u.phase is Phase.DONE:
                self._finished(u.request_id, log, u)

    def _finished(self, rid: str, log: RequestLog, u) -> None:
        log.done_reason, log.error = u.done_reason, u.error
        self.live.remove(rid)
        key = u.done_reason.value if u.done_reason else "?"
        self.stats.finished[key] = self.stats.finished.get(key, 0) + 1
        shown = len(log.text) if self.one_char_per_token else log.new_tokens
        if shown != log.generated or log.new_tokens != log.generated:
            self.stats.lost_tokens += abs(log.generated - shown)
            raise InvariantViolation(f"{rid}: {log.generated} tokens generated, {log.new_tokens} "
                                     f"reported, {len(log.text)} characters shown")
        if u.done_reason in (DoneReason.STOP, DoneReason.LENGTH) and log.session_id in self.sessions:
            self.sessions[log.session_id].append(Message("assistant", log.text or "."))

    def finish(self, max_steps: int = 100_000) -> None:
        """Close every conversation, run to idle, and demand that nothing is left."""
        if self.engine.warm is not None:
            self.engine.warm.store.close()  # its writer thread ends with the episode
        for sid in list(self.engine.scheduler.sessions) + list(self.sessions):
            self.engine.close_session(sid)
        self.sessions.clear()
        for _ in range(max_steps):
            if not self.engine.has_work():
                break
            self.step()
        if self.live:
            raise InvariantViolation(f"requests never reported done: {self.live[:5]}")
        if not self.engine.is_empty():
            raise InvariantViolation(f"not empty after closing everything: {self.engine.leaks()}")
        if (isinstance(self.backend, FakeBackend) and self.backend.samplers) or self.backend.kv_cells_used() != 0:
            raise InvariantViolation(f"backend still holds {self.backend.kv_cells_used()} cells or samplers")

    def leaked(self) -> tuple[int, int]:
        """(KV cells, slots) held right now; after finish() both must be 0."""
        s = self.engine.scheduler
        return s.kv.cells_used(), s.n_seq_max - len(s.residency.free_slots())
