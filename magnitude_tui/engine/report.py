"""Provides the step report: each sequence's update (seq_update) and the report that carries them
(StepReporter), built from what the scheduler and the intake hold after a step."""

from __future__ import annotations

import functools
from typing import Callable, Protocol

from backend.protocol import DecodeOutcome, DecodeResult
from magnitude_tui.engine.events import RamTierState, Rejection, SeqUpdate, SpecFacts, StepReport, ThreadState
from magnitude_tui.engine.sampling import StepSampler
from magnitude_tui.engine.threads import ThreadGovernor
from magnitude_tui.engine.warm import WarmResume
from scheduler.planner import Scheduler
from scheduler.sequence import Sequence
from scheduler.types import BatchPlan, DoneReason, Phase


class Arrivals(Protocol):
    """What the reporter reads from the intake: the live requests (it drops those it reports
    done) and the answers for submits that never became live."""

    live: dict[str, Sequence]

    def take_extra(self) -> list[SeqUpdate]: ...

    def take_rejected(self) -> list[Rejection]: ...


def seq_update(seq: Sequence, now: float) -> SeqUpdate:
    """The sequence's update as of `now`; the text and tokens it carries are no longer pending."""
    m = seq.metrics
    if seq.tool_parser is not None and seq.is_finished:
        seq.text_pending += seq.tool_parser.finish()  # text held back in case a call began
    text, n_new = seq.text_pending, seq.new_tokens_pending
    seq.text_pending, seq.new_tokens_pending = "", 0
    calls, seq.tool_calls_pending = tuple(seq.tool_calls_pending), []
    return SeqUpdate(
        request_id=seq.request_id,
        session_id=seq.session_id,
        seq_id=seq.seq_id if seq.seq_id is not None else seq.last_seq_id,
        phase=seq.phase,
        text_delta=text,
        new_tokens=n_new,
        prompt_done=seq.prompt_done,
        prompt_total=len(seq.prompt),
        cached_tokens=seq.num_cached,
        generated=len(seq.output),
        queue_ms=m.queue_ms,
        ttft_ms=m.ttft_ms,
        preparing_ms=m.preparing_ms,
        prefill_ms=m.prefill_ms,
        tok_s_live=m.live_tok_s(now),
        tok_s=m.final_tok_s,
        itl_p50_ms=m.itl_p50_ms,
        itl_p95_ms=m.itl_p95_ms,
        itl_max_ms=m.itl_max_ms,
        done_reason=seq.done_reason,
        error_kind=seq.error_kind,
        error=seq.error,
        waiting_reason=seq.waiting_reason,
        dropped_messages=seq.dropped_messages,
        priority=seq.priority,
        spec=SpecFacts(seq.num_drafted, seq.num_accepted,
                       len(seq.output) / seq.num_gen_steps if seq.num_gen_steps else None),
        tool_calls=calls,
        grammar_ms=seq.grammar_ms,
        yielding=seq.yielding and not seq.is_finished,
    )


def thread_state(governor: ThreadGovernor | None, n_threads: int) -> ThreadState | None:
    """The governor's state, or the fixed count the backend was loaded with (None: no CPU threads)."""
    if governor is not None:
        return governor.state
    return _fixed_threads(n_threads) if n_threads else None


@functools.lru_cache(maxsize=8)
def _fixed_threads(n_threads: int) -> ThreadState:
    # Frozen: every report of a fixed count may carry the same one.
    return ThreadState(n_threads, n_threads, "fixed")


class StepReporter:
    """Builds each step's StepReport; numbers the reports and retires the requests it reports done."""

    def __init__(self, scheduler: Scheduler, sampler: StepSampler, arrivals: Arrivals,
                 warm: WarmResume | None, threads: Callable[[], ThreadState | None]) -> None:
        self.scheduler = scheduler
        self.sampler = sampler
        self.arrivals = arrivals
        self.warm = warm
        self.threads = threads
        self.num_reports = 0
        self._policy: object = None  # the policy last reported, and its text (formatted once)
        self._policy_text = ""

    def report(self, plan: BatchPlan | None, result: DecodeResult | None, now: float,
               step_ms: float) -> StepReport | None:
        """None when no rows ran and nothing changed that a client would see."""
        self.sampler.release()
        updates = self.arrivals.take_extra()
        rejected = self.arrivals.take_rejected()
        live = self.arrivals.live
        for rid, seq in list(live.items()):
            if seq.last_reported is None and seq.phase is not Phase.PREPARING:
                # Its first report: it was preparing before whatever it is doing now.
                updates.append(SeqUpdate(request_id=rid, session_id=seq.session_id, seq_id=None,
                                         phase=Phase.PREPARING))
            if seq.is_finished:
                if seq.done_reason is DoneReason.CANCELLED and seq.detok is not None:
                    seq.text_pending += seq.detok.flush()  # text held for a possible stop string
                seq.metrics.on_finish(now)
                del live[rid]
                if self.warm is not None and seq.done_reason is not DoneReason.ERROR:
                    self.warm.went_idle(seq.session_id, now)
            sig = (seq.phase, seq.seq_id, seq.prompt_done, len(seq.output), seq.num_cached,
                   seq.waiting_reason, seq.done_reason, seq.yielding)
            if sig != seq.last_reported or seq.text_pending or seq.tool_calls_pending:
                seq.last_reported = sig
                updates.append(seq_update(seq, now))
        if plan is None and not updates and not rejected:
            return None
        self.num_reports += 1
        s = self.scheduler
        if s.policy is not self._policy:
            self._policy, self._policy_text = s.policy, str(s.policy)
        return StepReport(
            step=self.num_reports,
            t=now,
            step_ms=step_ms,
            decode_rows=plan.n_decode if plan else 0,
            prefill_rows=plan.n_prefill if plan else 0,
            budget=plan.budget if plan else 0,
            kv_used=s.kv_used(),
            kv_total=s.n_ctx,
            kv_idle=s.kv_idle(),
            waiting=s.num_waiting,
            running=s.num_running,
            policy=self._policy_text,
            updates=updates,
            outcome=result.outcome if result else DecodeOutcome.OK,
            rejected=rejected,
            threads=self.threads(),
            draft_rows=plan.n_draft if plan else 0,
            draft_accepted=self.sampler.accepted if plan else 0,
            spec=s.speculator.mode.value,
            yielded_rows=s.composer.num_yielded if plan else 0,
            ram=self._ram_state(),
        )

    def _ram_state(self) -> RamTierState | None:
        ram = self.scheduler.residency.ram
        if not len(ram) and not ram.restored_count:
            return None  # off, or nothing evicted into it yet: nothing to show
        return RamTierState(ram.used, ram.budget, len(ram), ram.restored_count)
