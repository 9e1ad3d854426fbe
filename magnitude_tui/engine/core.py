"""Provides Engine: the step loop that owns the backend, in process (the worker wraps it)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from backend.protocol import WALL_CLOCK, Backend, Clock, DecodeOutcome, DecodeResult, PlanError
from magnitude_tui.engine.calibrate import calibration_steps
from magnitude_tui.engine.context import fit_conversation
from magnitude_tui.engine.events import (Cancel, CloseSession, Command, RestoreOutcome, RestoreSession,
                                         SessionRestored, SetPolicy, SetSpec, Submit)
from magnitude_tui.engine.report import StepReporter, seq_update, thread_state
from magnitude_tui.engine.sampling import StepSampler
from magnitude_tui.engine.text import ReplyText
from magnitude_tui.engine.threads import CpuLoad, ThreadGovernor
from magnitude_tui.engine.warm import WarmResume
from magnitude_tui.engine.warm_store import WarmStore
from scheduler.budget import CostModel, CostParams, parse_policy
from scheduler.drafts import DraftKind, DraftSource
from scheduler.ngram import NgramSource
from scheduler.speculation import SpecMode, available_sources, parse_spec_mode
from scheduler.speculator import Speculator
from scheduler.planner import RequestError, Scheduler
from scheduler.sequence import Sequence
from scheduler.types import (BatchPlan, DoneReason, ErrorKind, Phase, Rejection, RejectReason, Request, SeqUpdate,
                             StepReport, ThreadState, plan_kpos)
from scheduler.validation import check_id, check_policy_text, check_request


class Engine:
    """Owns one backend and runs its steps; everything else talks to it through commands.

    `submit`, `cancel`, `close_session` and `set_policy` are safe from any thread: they queue a
    command that the owner thread's next `step()` applies first (cancellations once more right
    before sampling). Only the owner thread may call `step`, `run_until_idle` and `calibrate`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        policy: str = "target:50",
        clock: Clock | None = None,
        coalesce_ms: float = 5.0,
        gen_reserve: int = 256,
        sleep: Callable[[float], None] | None = None,
        prepare_notice_chars: int | None = 8000,
        auto_threads: bool = False,
        warm: WarmStore | None = None,
        spec: SpecMode | str = SpecMode.OFF,
        drafts: dict[DraftKind, DraftSource] | None = None,
    ) -> None:
        """`auto_threads`: choose the backend's CPU thread count between steps, from 1 up to its
        `max_threads`, by measuring (see engine/threads.py); off, the count stays as loaded.
        `warm`: where idle conversations' KV is saved, and restored from (None: nowhere)."""
        self.backend = backend
        # A request whose messages hold this many characters is announced as `preparing` in a
        # report of its own before the chat template and tokenizer run (None: never).
        self.prepare_notice_chars = prepare_notice_chars
        # A simulated backend brings its own virtual clock; metrics must read the same time.
        self._clock = clock or backend.clock
        self._sleep = sleep or self._clock.sleep
        self.coalesce_s = coalesce_ms / 1000.0
        self.scheduler = Scheduler(
            backend,
            n_ctx=backend.n_ctx,
            n_seq_max=backend.n_seq_max,
            n_batch=backend.n_batch,
            n_ctx_seq=backend.n_ctx_seq,
            policy=policy,
            gen_reserve=gen_reserve,
            cost=CostModel(backend.known_costs),
            attention=backend.attention_path,
            attention_tile=backend.attention_tile_rows,
            n_ubatch=backend.n_ubatch,
            # n-gram lookup is always there; a draft model only when one was loaded.
            speculator=Speculator({DraftKind.NGRAM: NgramSource(), **(drafts or {})}, parse_spec_mode(spec)),
        )
        self._spec_text = self.scheduler.speculator.mode.value
        self._policy_text = str(self.scheduler.policy)
        self._lock = threading.Lock()
        self._commands: deque[tuple[Command, float]] = deque()  # with the time each was queued
        self.live: dict[str, Sequence] = {}  # submitted and not yet reported done
        self._extra: list[SeqUpdate] = []  # updates for requests that never became live
        self._rejected: list[Rejection] = []  # submits refused before they became requests
        self._sessions_seen: set[str] = set()  # conversations a request named (until closed)
        self._intake: list[Sequence] = []  # submitted, not yet tokenized (phase `preparing`), FIFO
        self._noticed = False  # the last step only announced slow requests; tokenize them now
        self._sampler = StepSampler(backend, self.scheduler, self._clock)
        self.threads: ThreadGovernor | None = None
        if auto_threads and backend.max_threads > 1:
            # Other processes' load means something only in real time (not on a simulated clock).
            load = CpuLoad(backend.max_threads) if self._clock is WALL_CLOCK else None
            self.threads = ThreadGovernor(start=max(1, min(backend.n_threads, backend.max_threads)),
                                          max_threads=backend.max_threads, load=load, now=self._clock())
        self.warm = WarmResume(backend, self.scheduler, warm) if warm is not None else None
        self._notices: list[SessionRestored] = []  # answers to RestoreSession, for take_notices()
        self._reporter = StepReporter(self.scheduler, self._sampler, self, self.warm, self._thread_state)

    # ---- commands (any thread) -----------------------------------------------------------------

    def submit(self, req: Request) -> str:
        """Queue a request. Whatever is wrong with it is reported by the next step: an update
        ending it with `error` under its id, or a Rejection when its id cannot carry one (not
        text, or another live request's)."""
        self._queue(Submit(req))
        return getattr(req, "request_id", None)

    def cancel(self, request_id: str) -> None:
        """ValueError (here, now) unless the id is text."""
        check_id("request_id", request_id)
        self._queue(Cancel(request_id))

    def close_session(self, session_id: str) -> None:
        """ValueError (here, now) unless the id is text."""
        check_id("session_id", session_id)
        self._queue(CloseSession(session_id))

    def set_policy(self, policy: str) -> None:
        """Switch the budget policy from the next step; ValueError (here, now) if malformed."""
        parsed = str(parse_policy(check_policy_text(policy)))
        with self._lock:
            self._policy_text = parsed
        self._queue(SetPolicy(parsed))

    def restore_session(self, session_id: str, messages) -> None:
        """Bring back the conversation's saved KV (warm resume); answered by a SessionRestored
        from take_notices() after the next step. ValueError (here, now) unless the id is text."""
        check_id("session_id", session_id)
        self._queue(RestoreSession(session_id, tuple(messages)))

    def take_notices(self) -> list[SessionRestored]:
        """What the engine has to say besides step reports (owner thread)."""
        notices, self._notices = self._notices, []
        return notices

    def shutdown(self) -> None:
        """The app is quitting: save the conversations whose latest reply is not saved yet."""
        if self.warm is not None:
            self.warm.save_all()

    def set_spec(self, mode: SpecMode | str) -> None:
        """Switch speculation from the next step; ValueError (here, now) for an unknown mode or
        one whose draft source is not loaded."""
        parsed = parse_spec_mode(mode)
        available_sources(parsed, self.scheduler.speculator.sources)
        with self._lock:
            self._spec_text = parsed.value
        self._queue(SetSpec(parsed.value))

    @property
    def spec(self) -> str:
        return self._spec_text

    def _queue(self, command: Command) -> None:
        t = self._clock()  # a submit's queue time and TTFT count from here
        with self._lock:
            self._commands.append((command, t))

    @property
    def policy(self) -> str:
        return self._policy_text

    @property
    def cost(self) -> CostParams:
        return self.scheduler.cost.params

    # ---- the loop (owner thread) ---------------------------------------------------------------

    def has_work(self) -> bool:
        with self._lock:
            pending = bool(self._commands)
        return pending or bool(self._intake) or self.scheduler.has_work()

    def step(self) -> StepReport | None:
        """Run one step; None when there was nothing to run and nothing to report.

        A new request is reported as `preparing` first. When its messages are long (tokenizing
        them takes a while), the step stops right there with a report that runs no rows, so the
        user sees `preparing` while the next step tokenizes; short ones are tokenized at once and
        their `preparing` update shares the report with their first `queued`/`prefill` one.
        """
        now = self._clock()
        if self.warm is not None:
            self.warm.tick(now)
        self._apply_commands()
        if not self._noticed and any(self._slow_to_prepare(q) for q in self._intake
                                     if q.last_reported is None):
            self._noticed = True
            return self._reporter.report(None, None, now, 0.0)
        self._noticed = False
        self._prepare_intake()
        if self._coalescing(now):
            return self._reporter.report(None, None, now, 0.0)
        plan = self.scheduler.schedule(now)
        if plan is None:
            return self._reporter.report(None, None, now, 0.0)
        predicted_ms = self._predicted_ms(plan)
        t0 = self._clock()
        result, error = self._decode(plan)
        self._apply_commands(cancellations_only=True)
        ready = self.scheduler.postprocess(plan, result, error)
        self._sampler.sample(ready, result)
        t1 = self._clock()
        if self.threads is not None and result.outcome is DecodeOutcome.OK:
            n = self.threads.after_step(t1, result.step_ms, predicted_ms)
            if n != self.backend.n_threads:
                self.backend.set_n_threads(n)
        return self._reporter.report(plan, result, t1, (t1 - t0) * 1000.0)

    def run_until_idle(self, max_steps: int = 100_000) -> list[StepReport]:
        """Step until nothing is left (or max_steps), waiting out coalescing windows."""
        reports: list[StepReport] = []
        for _ in range(max_steps):
            report = self.step()
            if report is not None:
                reports.append(report)
            if not self.has_work():
                break
            if report is None or report.decode_rows + report.prefill_rows == 0:
                wait = self.wait_hint()
                if wait:
                    self._sleep(wait)
        return reports

    def wait_hint(self) -> float | None:
        """Seconds until `step()` will have rows to run (None: idle, 0: now)."""
        if not self.has_work():
            return None
        if self._intake:
            return 0.0
        window_end = self._window_end()
        if window_end is None:
            return 0.0
        return max(0.0, window_end - self._clock())

    def calibrate(self) -> CostParams:
        """Fit the cost model from a few timed steps on free slots (or read a simulated profile)."""
        prior = self.backend.known_costs
        if prior is not None:
            self.scheduler.cost.seed(prior)
            return prior
        if self.scheduler.has_work():
            raise RuntimeError("calibrate() must run before any request is submitted")
        fit = CostModel(self.scheduler.cost.prior, anchor=1e-3, row_cost_range=None)
        for d, p, ms, kpos in calibration_steps(self.backend, self.scheduler):
            fit.observe(d, p, ms, kpos)
        self.scheduler.cost.seed(fit.params)
        return fit.params

    def fail_all(self, message: str) -> StepReport | None:
        """End every live request with an error (shutdown, a dying backend); report it."""
        for seq in list(self.live.values()):
            self.scheduler.finish(seq, DoneReason.ERROR, message)
        self._intake = []
        return self._reporter.report(None, None, self._clock(), 0.0)

    # ---- inspection ----------------------------------------------------------------------------

    def leaks(self) -> list[str]:
        problems = self.scheduler.leaks()
        if self.live:
            problems.append(f"live requests: {sorted(self.live)}")
        if self._sampler.owner:
            problems.append(f"samplers held for seq ids {sorted(self._sampler.owner)}")
        return problems

    def is_empty(self) -> bool:
        """No request, session, slot, KV cell, sampler or command left (after closing sessions)."""
        with self._lock:
            pending = bool(self._commands)
        return not pending and not self.leaks() and self.scheduler.is_empty()

    # ---- inside a step -------------------------------------------------------------------------

    def _apply_commands(self, cancellations_only: bool = False) -> None:
        with self._lock:
            if cancellations_only:
                todo, keep = _split_cancellations(self._commands)
                self._commands = deque(keep)
            else:
                todo = list(self._commands)
                self._commands.clear()
        for cmd, t in todo:
            if isinstance(cmd, Submit):
                self._take(cmd.request, t)
            elif isinstance(cmd, Cancel):
                self._cancel(cmd.request_id)
            elif isinstance(cmd, CloseSession):
                self._close(cmd.session_id)
            elif isinstance(cmd, SetPolicy):
                self.scheduler.set_policy(cmd.policy)
            elif isinstance(cmd, RestoreSession):
                self._restore(cmd)
            elif isinstance(cmd, SetSpec):
                self.scheduler.set_spec(parse_spec_mode(cmd.mode))

    def _take(self, req: Request, t_submit: float) -> None:
        """Accept a submitted request as `preparing`; it is tokenized before the next schedule.
        A malformed one ends here, alone, with its error."""
        rid, sid = getattr(req, "request_id", None), getattr(req, "session_id", None)
        ids_ok = all(isinstance(x, str) and x for x in (rid, sid))
        if ids_ok and rid in self.live:
            self._reject(req, RejectReason.DUPLICATE_ID,
                         f"request id {rid!r} is already in use by a live request; use a new id")
            return
        try:
            check_request(req)
            if req.fork_from is not None and req.fork_from not in self._sessions_seen:
                raise RequestError(
                    f"fork_from {req.fork_from!r} names no conversation this engine knows (never "
                    "submitted, or closed); send the request without fork_from to start cold")
        except RequestError as e:
            if not ids_ok:
                self._reject(req, RejectReason.BAD_ID if isinstance(req, Request)
                             else RejectReason.MALFORMED, str(e))
                return
            seq = Sequence(req, [], t_submit=t_submit)
            seq.phase, seq.done_reason, seq.error = Phase.DONE, DoneReason.ERROR, str(e)
            seq.error_kind = e.kind
            self._extra.append(seq_update(seq, t_submit))
            return
        self._sessions_seen.add(sid)
        self.live[rid] = Sequence(req, [], t_submit=t_submit)
        self._intake.append(self.live[rid])

    def _restore(self, cmd: RestoreSession) -> None:
        if self.warm is None:
            notice = SessionRestored(cmd.session_id, RestoreOutcome.UNSUPPORTED, detail="this engine saves no KV")
        else:
            notice = self.warm.restore(cmd)
        if notice.outcome is RestoreOutcome.RESTORED:
            self._sessions_seen.add(cmd.session_id)  # a known conversation: subagents may fork it
        self._notices.append(notice)

    def _reject(self, req: object, reason: RejectReason, message: str) -> None:
        rid, sid = getattr(req, "request_id", None), getattr(req, "session_id", None)
        self._rejected.append(Rejection(
            request_id=rid if isinstance(rid, str) else repr(rid)[:80],
            session_id=sid if isinstance(sid, str) else None, reason=reason, message=message))

    def _cancel(self, request_id: str) -> None:
        seq = self.live.get(request_id)
        if seq is not None and seq in self._intake:
            self._intake.remove(seq)
            self.scheduler.finish(seq, DoneReason.CANCELLED)
        else:
            self.scheduler.cancel(request_id)

    def _close(self, session_id: str) -> None:
        for seq in [q for q in self._intake if q.session_id == session_id]:
            self._intake.remove(seq)
            self.scheduler.finish(seq, DoneReason.CANCELLED)
        self.scheduler.close_session(session_id)
        self._sessions_seen.discard(session_id)

    def _slow_to_prepare(self, seq: Sequence) -> bool:
        """Long messages: the chat template and tokenizer take long enough for the user to see."""
        limit = self.prepare_notice_chars
        req = seq.request
        return (limit is not None and req.prompt_tokens is None
                and sum(len(m.content) for m in req.messages) >= limit)

    def _prepare_intake(self) -> None:
        intake, self._intake = self._intake, []
        for seq in intake:
            if not seq.is_finished:
                self._prepare(seq)

    def _prepare(self, seq: Sequence) -> None:
        """Tokenize an accepted request and queue it; a bad request fails alone, right here."""
        req = seq.request
        try:
            seq.detok = ReplyText(self.backend.detokenizer(), req.sampling.stop)
            if req.prompt_tokens is not None:
                prompt = list(req.prompt_tokens)
            else:
                # A conversation that outgrew its sequence drops its oldest turns (context.py).
                limit = min(self.scheduler.n_ctx_seq, self.scheduler.n_ctx)
                fitted = fit_conversation(req.messages, lambda ms: list(self.backend.tokenize_chat(ms)),
                                          limit, seq.max_tokens)
                prompt, seq.dropped_messages = fitted.prompt, fitted.dropped
            bad = [t for t in prompt if not 0 <= t < self.backend.n_vocab]
            if bad:
                raise RequestError(f"token id {bad[0]} is outside the model's vocabulary "
                                   f"(0..{self.backend.n_vocab - 1})")
            seq.prompt = prompt
            self.scheduler.add(seq)
        except RequestError as e:
            self.scheduler.finish(seq, DoneReason.ERROR, str(e), e.kind)
        except Exception as e:  # a template or tokenizer failure belongs to this request only
            self.scheduler.finish(seq, DoneReason.ERROR, f"could not prepare the prompt: {e}",
                                  ErrorKind.INVALID)

    def _window_end(self) -> float | None:
        """When the idle coalescing window closes (None: no window open)."""
        s = self.scheduler
        if s.running or not s.waiting or self.coalesce_s <= 0:
            return None
        return min(q.metrics.t_submit for q in s.waiting) + self.coalesce_s

    def _coalescing(self, now: float) -> bool:
        # An idle engine waits a few ms after the first arrival, so a burst of spawned subagents
        # is admitted together and starts in one batch.
        end = self._window_end()
        return end is not None and now < end

    def _predicted_ms(self, plan: BatchPlan) -> float:
        """The step's time by the calibrated cost (the prior, not the live fit: the live fit
        follows the thread count's own times, so it could not tell one count from another)."""
        if self.threads is None:
            return 0.0
        s = self.scheduler
        return s.cost.prior.predict(plan.n_decode, plan.n_prefill,
                                    plan_kpos(plan, s.attention, s.kv.cells_used()))

    def _decode(self, plan: BatchPlan) -> tuple[DecodeResult, str | None]:
        try:
            return self.backend.decode(plan), None
        except PlanError as e:
            msg = f"internal error: the planned batch broke a native contract ({e})"
            return DecodeResult(DecodeOutcome.INVALID_BATCH, 0.0, {}, -1), msg
        except Exception as e:
            return DecodeResult(DecodeOutcome.FATAL, 0.0, {}, -2), f"the backend failed: {e}"

    def take_extra(self) -> list[SeqUpdate]:
        extra, self._extra = self._extra, []
        return extra

    def take_rejected(self) -> list[Rejection]:
        rejected, self._rejected = self._rejected, []
        return rejected

    def _thread_state(self) -> ThreadState | None:
        return thread_state(self.threads, self.backend.n_threads)


def _split_cancellations(commands) -> tuple[list[tuple[Command, float]], list[tuple[Command, float]]]:
    """The cancel/close commands that can run now, and the rest in order. A cancel (or close)
    that follows a still-pending submit for its request (or session) must wait its turn, or the
    submit would run after it and the cancel would be lost."""
    todo, keep = [], []
    rids, sids = set(), set()
    for entry in commands:
        cmd = entry[0]
        if isinstance(cmd, Submit):
            # A malformed request may carry anything as its ids; it is rejected when taken in.
            rids.add(str(getattr(cmd.request, "request_id", None)))
            sids.add(str(getattr(cmd.request, "session_id", None)))
            keep.append(entry)
        elif ((isinstance(cmd, Cancel) and cmd.request_id not in rids)
              or (isinstance(cmd, CloseSession) and cmd.session_id not in sids)):
            todo.append(entry)
        else:
            keep.append(entry)
    return todo, keep


