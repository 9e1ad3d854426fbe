"""Provides Engine: the step loop that owns the backend, in process (the worker wraps it)."""

from __future__ import annotations

import threading
from typing import Callable

from backend.cpu_load import CpuLoad
from backend.protocol import WALL_CLOCK, Backend, Clock, DecodeOutcome, DecodeResult, PlanError
from magnitude_tui.engine.calibrate import calibration_steps
from magnitude_tui.engine.events import (
    COMMANDS,
    Cancel,
    CloseSession,
    Command,
    CommandRejected,
    ForgetSession,
    PolicyChanged,
    RestoreSession,
    SessionRestored,
    SetPolicy,
    SetSpec,
    Shutdown,
    SpecChanged,
    StepReport,
    Submit,
    ThreadState,
)
from magnitude_tui.engine.intake import Intake
from magnitude_tui.engine.report import StepReporter, thread_state
from magnitude_tui.engine.sampling import StepSampler
from magnitude_tui.engine.threads import ThreadGovernor
from magnitude_tui.engine.warm import WarmResume
from magnitude_tui.engine.warm_store import WarmStore
from scheduler.budget import Policy, as_policy
from scheduler.cost_model import CostModel, CostParams
from scheduler.drafts import DraftKind, DraftSource
from scheduler.ngram import NgramSource
from scheduler.planner import Scheduler
from scheduler.ram_tier import DEFAULT_BYTES as DEFAULT_RAM_BYTES
from scheduler.speculation import SpecMode, available_sources, parse_spec_mode
from scheduler.speculator import Speculator
from scheduler.types import BatchPlan, Request, plan_kpos
from scheduler.validation import check_id

# What Engine.apply answers at once: the new setting, or why the command was not carried out.
Answer = PolicyChanged | SpecChanged | CommandRejected


class Engine:
    """Owns one backend and runs its steps; everything else talks to it through commands.

    `apply` (and its in-process shorthands `submit`, `cancel`, `set_policy`, ...) is safe from any
    thread: it queues the command for the owner thread's next `step()`, which applies it first
    (cancellations once more right before sampling). Only the owner thread may call `step`,
    `run_until_idle` and `calibrate`.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        policy: str | Policy = "target:50",
        clock: Clock | None = None,
        coalesce_ms: float = 5.0,
        gen_reserve: int = 256,
        sleep: Callable[[float], None] | None = None,
        prepare_notice_chars: int | None = 8000,
        auto_threads: bool = False,
        warm: WarmStore | None = None,
        spec: SpecMode | str = SpecMode.OFF,
        drafts: dict[DraftKind, DraftSource] | None = None,
        ram_bytes: int = DEFAULT_RAM_BYTES,
    ) -> None:
        """`auto_threads`: choose the backend's CPU thread count between steps, from 1 up to its
        `max_threads`, by measuring (see engine/threads.py); off, the count stays as loaded.
        `warm`: where idle conversations' KV is saved, and restored from (None: nowhere).
        `ram_bytes`: host memory for the KV of evicted idle conversations (0: none)."""
        self.backend = backend
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
            policy=as_policy(policy),
            gen_reserve=gen_reserve,
            cost=CostModel(backend.known_costs),
            attention=backend.attention_path,
            attention_tile=backend.attention_tile_rows,
            dense_kq_cells=backend.dense_kq_cells,
            n_ubatch=backend.n_ubatch,
            # n-gram lookup is always there; a draft model only when one was loaded.
            speculator=Speculator({DraftKind.NGRAM: NgramSource(), **(drafts or {})}, parse_spec_mode(spec)),
            ram_bytes=ram_bytes,
        )
        self._spec_text = self.scheduler.speculator.mode.value
        self._policy_text = str(self.scheduler.policy)
        self._lock = threading.Lock()  # guards the policy and spec texts read from any thread
        self._sampler = StepSampler(backend, self.scheduler, self._clock)
        self.threads: ThreadGovernor | None = None
        if auto_threads and backend.max_threads > 1:
            # Other processes' load means something only in real time (not on a simulated clock).
            load = CpuLoad(backend.max_threads) if self._clock is WALL_CLOCK else None
            self.threads = ThreadGovernor(start=max(1, min(backend.n_threads, backend.max_threads)),
                                          max_threads=backend.max_threads, load=load, now=self._clock())
        self.warm = WarmResume(backend, self.scheduler, warm) if warm is not None else None
        self._intake = Intake(backend, self.scheduler, self._clock, self.warm, prepare_notice_chars)
        self._reporter = StepReporter(self.scheduler, self._sampler, self._intake, self.warm, self._thread_state)

    @property
    def prepare_notice_chars(self) -> int | None:
        """A request whose messages hold this many characters is announced as `preparing` in a
        report of its own before the chat template and tokenizer run (None: never)."""
        return self._intake.notice_chars

    @prepare_notice_chars.setter
    def prepare_notice_chars(self, chars: int | None) -> None:
        self._intake.notice_chars = chars

    # ---- commands (any thread) -----------------------------------------------------------------

    def apply(self, command: Command) -> Answer | None:
        """Take one command, as the worker pipe carries it: queued for the next step, and answered
        at once when it changes a setting (PolicyChanged, SpecChanged) or cannot be carried out
        (CommandRejected: whatever a client sends, the engine goes on). A malformed request is
        reported by the next step, under its own id (see `submit`)."""
        try:
            return self._take(command)
        except ValueError as exc:
            what = {SetPolicy: "policy not changed", SetSpec: "speculation not changed"}.get(
                type(command), f"{type(command).__name__} ignored")
            return CommandRejected(message=f"{what}: {exc}")

    def _take(self, command: Command) -> Answer | None:
        """Check what can be checked now and queue the command; ValueError says what is wrong."""
        answer: Answer | None = None
        if isinstance(command, Submit):
            pass  # a request is checked when it is taken in, and fails alone
        elif isinstance(command, Cancel):
            check_id("request_id", command.request_id)
        elif isinstance(command, (CloseSession, ForgetSession, RestoreSession)):
            check_id("session_id", command.session_id)
        elif isinstance(command, SetPolicy):
            if not isinstance(command.policy, Policy):
                raise ValueError(f"SetPolicy carries a Policy (see scheduler.budget.as_policy), "
                                 f"got {command.policy!r:.60}")
            with self._lock:
                self._policy_text = str(command.policy)
            answer = PolicyChanged(policy=str(command.policy))
        elif isinstance(command, SetSpec):
            available_sources(parse_spec_mode(command.mode), self.scheduler.speculator.sources)
            with self._lock:
                self._spec_text = command.mode.value
            answer = SpecChanged(spec=command.mode.value)
        elif isinstance(command, Shutdown):
            # What came before it first (owner thread): a conversation closed or forgotten just
            # before quitting must not be saved on the way out.
            self._intake.apply()
            if self.warm is not None:
                self.warm.save_all()
            return None
        else:
            raise ValueError(f"unknown command {type(command).__name__}: the engine takes "
                             f"{', '.join(c.__name__ for c in COMMANDS)}")
        self._intake.queue(command)
        return answer

    def submit(self, req: Request) -> str | None:
        """Queue a request and return its id (None if it has none). Whatever is wrong with it is
        reported by the next step: an update ending it with `error` under its id, or a Rejection
        when its id cannot carry one (not text, or another live request's)."""
        self._take(Submit(req))
        return getattr(req, "request_id", None)

    def cancel(self, request_id: str) -> None:
        """ValueError (here, now) unless the id is text."""
        self._take(Cancel(request_id))

    def close_session(self, session_id: str) -> None:
        """ValueError (here, now) unless the id is text."""
        self._take(CloseSession(session_id))

    def set_policy(self, policy: str | Policy) -> None:
        """Switch the budget policy from the next step; ValueError (here, now) if malformed."""
        self._take(SetPolicy(as_policy(policy)))

    def set_spec(self, mode: SpecMode | str) -> None:
        """Switch speculation from the next step; ValueError (here, now) for an unknown mode or
        one whose draft source is not loaded."""
        self._take(SetSpec(parse_spec_mode(mode)))

    def restore_session(self, session_id: str, messages) -> None:
        """Bring back the conversation's saved KV (warm resume); answered by a SessionRestored
        from take_notices() after the next step. ValueError (here, now) unless the id is text."""
        self._take(RestoreSession(session_id, tuple(messages)))

    def shutdown(self) -> None:
        """The app is quitting (owner thread): apply what is queued, then save the conversations
        whose latest reply is not saved yet."""
        self._take(Shutdown())

    def take_notices(self) -> list[SessionRestored]:
        """What the engine has to say besides step reports (owner thread)."""
        return self._intake.take_notices()

    @property
    def spec(self) -> str:
        return self._spec_text

    @property
    def policy(self) -> str:
        return self._policy_text

    @property
    def cost(self) -> CostParams:
        return self.scheduler.cost.params

    # ---- the loop (owner thread) ---------------------------------------------------------------

    def has_work(self) -> bool:
        return self._intake.pending() or self._intake.unprepared or self.scheduler.has_work()

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
        self._intake.apply()
        if self._intake.announce():
            return self._reporter.report(None, None, now, 0.0)
        self._intake.prepare_all()
        now = self._clock()  # after tokenizing: a request's queue time starts where preparing ended
        if self._coalescing(now):
            return self._reporter.report(None, None, now, 0.0)
        plan = self.scheduler.schedule(now)
        if plan is None:
            return self._reporter.report(None, None, now, 0.0)
        predicted_ms = self._predicted_ms(plan)
        t0 = self._clock()
        result, error = self._decode(plan)
        self._intake.apply(cancellations_only=True)
        ready = self.scheduler.postprocess(plan, result, error)
        self._sampler.sample(ready, result)
        t1 = self._clock()
        if self.threads is not None and result.outcome is DecodeOutcome.OK:
            n = self.threads.after_step(t1, result.step_ms, predicted_ms, prompt=plan.n_prefill > 0)
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
        if self._intake.unprepared:
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
        # The fit saw shallow, narrow steps only: the first real ones widen their prompt rows as
        # measured steps bear it out (scheduler/ramp.py).
        self.scheduler.ramp.arm()
        return fit.params

    # ---- inspection ----------------------------------------------------------------------------

    def leaks(self) -> list[str]:
        problems = self.scheduler.leaks()
        if self._intake.live:
            problems.append(f"live requests: {sorted(self._intake.live)}")
        if self._sampler.owner:
            problems.append(f"samplers held for seq ids {sorted(self._sampler.owner)}")
        return problems

    def is_empty(self) -> bool:
        """No request, session, slot, KV cell, sampler or command left (after closing sessions)."""
        return not self._intake.pending() and not self.leaks() and self.scheduler.is_empty()

    # ---- inside a step -------------------------------------------------------------------------

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
        follows the thread count's own times, so it could not tell one count from another).
        Draft rows cost what decode rows do, as the planner prices them: left out, every step that
        verifies drafts looked slow and set off a probe at fewer threads."""
        if self.threads is None:
            return 0.0
        s = self.scheduler
        return s.cost.prior.predict(plan.n_decode + plan.n_draft, plan.n_prefill,
                                    plan_kpos(plan, s.attention, s.kv.span_cells()))

    def _decode(self, plan: BatchPlan) -> tuple[DecodeResult, str | None]:
        try:
            return self.backend.decode(plan), None
        except PlanError as e:
            msg = f"internal error: the planned batch broke a native contract ({e})"
            return DecodeResult(DecodeOutcome.INVALID_BATCH, 0.0, {}, -1), msg
        except Exception as e:
            return DecodeResult(DecodeOutcome.FATAL, 0.0, {}, -2), f"the backend failed: {e}"

    def _thread_state(self) -> ThreadState | None:
        return thread_state(self.threads, self.backend.n_threads)
