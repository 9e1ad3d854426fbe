"""Provides PromptRamp: how many prompt rows a step may take while the cost model is still unproven."""

from __future__ import annotations

from scheduler.budget import MIN_PREFILL_QUANTUM

# A step ran "as predicted" when it took at most this much longer than the larger of its predicted
# time and the target: only then has the prompt-row count it held been shown safe at this depth.
TRUST_SLACK = 1.25


class PromptRamp:
    """Start conservative and widen: a target policy's prompt rows per step are capped, from the
    engine's first step, by what measured steps have shown the cost model right about.

    A calibration runs near position 0 over at most a few sequences; the first steps after a start
    (a resume's deep conversations, eight subagents forking a long parent) run deeper and wider, and
    a model fitted shallow priced their prompt rows several times too cheap: seconds-long steps
    under a 50 ms target until the online fit caught up. So the cap starts at one quantum and
    doubles after each step that used at least half of it and ran within TRUST_SLACK of the larger
    of its prediction and the target; a step that ran over that halves it (the fit has just learned
    something). Once the model is right, its own row count binds and the cap stops mattering.
    A profile whose costs are exact (a simulated backend) needs no ramp: it stays off until armed.
    """

    def __init__(self, n_batch: int) -> None:
        self.n_batch = n_batch
        self.limit: int | None = None  # None: off (no cap)

    @property
    def armed(self) -> bool:
        return self.limit is not None

    def arm(self) -> None:
        """The cost model was just fitted from a calibration: trust it one quantum at a time."""
        self.limit = MIN_PREFILL_QUANTUM

    def cap(self, allowance: int) -> int:
        return allowance if self.limit is None else min(allowance, self.limit)

    def observe(self, prefill_rows: int, step_ms: float, predicted_ms: float, target_ms: float | None) -> None:
        """A successful step: widen, hold or narrow the cap (untimed steps teach nothing)."""
        if self.limit is None or step_ms <= 0 or prefill_rows <= 0:
            return
        if 2 * prefill_rows < self.limit:
            return  # the cap did not bind: this step says nothing about it
        if step_ms > TRUST_SLACK * max(predicted_ms, target_ms or 0.0):
            self.limit = max(MIN_PREFILL_QUANTUM, prefill_rows // 2)
        else:
            self.limit = min(2 * self.limit, self.n_batch)
