"""Provides KvRelief: what the scheduler does after a step failed for lack of a KV slot."""

from __future__ import annotations

from typing import Callable

from scheduler.sequence import Sequence
from scheduler.types import BatchPlan

# A lone sequence whose decode keeps failing for lack of KV room is out of context, not unlucky.
KV_FAILURES_BEFORE_GIVING_UP = 3


class KvRelief:
    """After "no KV slot": retry with half the prompt rows (relaxed again, doubling, after steps
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
                      evict_idle: Callable[[], bool]) -> tuple[str, Sequence | None]:
        """Decide the next remedy: ("smaller", None), ("evicted", None), ("preempt", seq),
        ("give_up", seq) or ("wait", None). Shrinking and evicting are done here."""
        self.failures += 1
        if plan.n_prefill > 1:
            self.prefill_cap = max(1, plan.n_prefill // 2)
            return "smaller", None
        if evict_idle():
            return "evicted", None
        if len(running) > 1:
            # The lowest class first, and within it the newest (it has the least to recompute).
            return "preempt", max(running, key=lambda s: (s.priority, s.admit_order))
        if running and self.failures >= KV_FAILURES_BEFORE_GIVING_UP:
            return "give_up", running[0]
        return "wait", None
