"""Provides KvRelief: what the scheduler does after a step failed for lack of a KV slot."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable

from scheduler.sequence import Sequence
from scheduler.types import BatchPlan

# A lone sequence whose decode keeps failing for lack of KV room is out of context, not unlucky.
KV_FAILURES_BEFORE_GIVING_UP = 3

# After "no KV slot" in a step that verified drafts, no drafts for this many steps: their rows are
# the cheapest to give up (each is only a guess), and the cache is near full.
DRAFT_PAUSE_STEPS = 32


class Remedy(Enum):
    """What to do after a step failed for lack of a KV slot."""

    NO_DRAFTS = "no_drafts"  # retry without draft rows for a while
    SMALLER = "smaller"  # retry with fewer prompt rows (already applied to the cap)
    EVICTED = "evicted"  # an idle conversation's cache was dropped (already done)
    PREEMPT = "preempt"  # free a running sequence's KV; it recomputes later
    GIVE_UP = "give_up"  # a lone sequence is out of context
    WAIT = "wait"  # nothing to do this step; try again


@dataclass(frozen=True)
class ReliefVerdict:
    remedy: Remedy
    seq: Sequence | None = None  # the sequence to preempt or give up on


class KvRelief:
    """After "no KV slot": first retry without draft rows, then with half the prompt rows (relaxed again, doubling, after steps
    that succeed), then drop an idle conversation's cache, then preempt the most recently admitted
    sequence of the lowest priority class; a lone sequence that still cannot fit after a few tries has run out of room."""

    def __init__(self, n_batch: int) -> None:
        self.n_batch = n_batch
        self.prefill_cap: int | None = None  # shrunk after "no KV slot", relaxed after successes
        self.failures = 0

    def cap(self, allowance: int) -> int:
        """The prompt rows the next plan may hold."""
        return allowance if self.prefill_cap is None else min(allowance, self.prefill_cap)

    def on_success(self) -> None:
        self.failures = 0
        if self.prefill_cap is not None:
            self.prefill_cap *= 2
            if self.prefill_cap >= self.n_batch:
                self.prefill_cap = None

    def on_no_kv_slot(self, plan: BatchPlan, running: list[Sequence],
                      evict_idle: Callable[[], bool]) -> ReliefVerdict:
        """Decide the next remedy; shrinking and evicting are done here, preempting and giving up
        are the scheduler's (the verdict names the sequence)."""
        if plan.n_draft > 0:
            return ReliefVerdict(Remedy.NO_DRAFTS)
        self.failures += 1
        if plan.n_prefill > 1:
            self.prefill_cap = max(1, plan.n_prefill // 2)
            return ReliefVerdict(Remedy.SMALLER)
        if evict_idle():
            return ReliefVerdict(Remedy.EVICTED)
        if len(running) > 1:
            # The lowest class first, and within it the newest (it has the least to recompute).
            return ReliefVerdict(Remedy.PREEMPT, max(running, key=lambda s: (s.priority, s.admit_order)))
        if running and self.failures >= KV_FAILURES_BEFORE_GIVING_UP:
            return ReliefVerdict(Remedy.GIVE_UP, running[0])
        return ReliefVerdict(Remedy.WAIT)
