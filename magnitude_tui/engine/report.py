"""Provides what a step report is made of: each sequence's update (seq_update) and the thread state."""

from __future__ import annotations

from magnitude_tui.engine.threads import ThreadGovernor
from scheduler.sequence import Sequence
from scheduler.types import SeqUpdate, ThreadState


def seq_update(seq: Sequence, now: float) -> SeqUpdate:
    """The sequence's update as of `now`; the text and tokens it carries are no longer pending."""
    m = seq.metrics
    text, n_new = seq.text_pending, seq.new_tokens_pending
    seq.text_pending, seq.new_tokens_pending = "", 0
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
        drafted=seq.num_drafted,
        accepted=seq.num_accepted,
        tokens_per_step=len(seq.output) / seq.num_gen_steps if seq.num_gen_steps else None,
    )


def thread_state(governor: ThreadGovernor | None, n_threads: int) -> ThreadState | None:
    """The governor's state, or the fixed count the backend was loaded with (None: no CPU threads)."""
    if governor is not None:
        return governor.state
    return ThreadState(n_threads, n_threads, "fixed") if n_threads else None
