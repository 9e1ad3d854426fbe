"""Provides per-request latency metrics: queue time, TTFT, live and final tok/s, ITL percentiles."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

# The live rate looks back this far: long enough to smooth one slow step, short enough that a
# stall shows within a couple of seconds.
LIVE_WINDOW_S = 2.0


def observed_percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (q in 0..100): a request's ITL p95 is a
    gap it really had (tests pin it). Tables and panels use scheduler.stats.percentile."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, round(q / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


def partition_ms(parts: list[float], ndigits: int = 0) -> list[float]:
    """Round consecutive durations at their cumulative boundaries, so that the rounded parts add
    up exactly to the rounded total (rounding each part alone can miss it by a unit per part)."""
    out, edge, acc = [], 0.0, 0.0
    for part in parts:
        acc += part
        end = round(acc, ndigits)
        out.append(round(end - edge, ndigits))
        edge = end
    return out


@dataclass
class RequestMetrics:
    """Timestamps (engine clock, seconds) of one request's life and what follows from them."""

    t_submit: float
    t_prepared: float | None = None  # chat template and tokenizer done, handed to the scheduler
    t_admit: float | None = None
    t_first_scheduled: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_finish: float | None = None
    num_tokens: int = 0
    token_times: list[float] = field(default_factory=list)  # when each visible token arrived
    # Sorted, so percentiles stay O(1) per report however long the reply gets.
    _itl_sorted: list[float] = field(default_factory=list)
    _recent: deque = field(default_factory=deque)
    # Whether `_recent` is in time order (a clock that never goes back): the live rate then
    # counts from the window's old end instead of reading every token in it, every report.
    _recent_in_order: bool = True

    def on_prepared(self, now: float) -> None:
        if self.t_prepared is None:
            self.t_prepared = now

    def on_admit(self, now: float) -> None:
        if self.t_admit is None:
            self.t_admit = now

    def on_scheduled(self, now: float) -> None:
        if self.t_first_scheduled is None:
            self.t_first_scheduled = now

    def on_token(self, now: float) -> None:
        if self.t_first_token is None:
            self.t_first_token = now
        elif self.t_last_token is not None:
            bisect.insort(self._itl_sorted, (now - self.t_last_token) * 1000.0)
        self.t_last_token = now
        self.num_tokens += 1
        self.token_times.append(now)
        if self._recent and now < self._recent[-1]:
            self._recent_in_order = False
        self._recent.append(now)
        while self._recent and self._recent[0] < now - LIVE_WINDOW_S:
            self._recent.popleft()

    def on_finish(self, now: float) -> None:
        if self.t_finish is None:
            self.t_finish = now

    # ---- derived -------------------------------------------------------------------------------

    # Time to first token in three phases that partition it, cut at the same timestamps:
    # preparing (submit -> tokenized), queued (tokenized -> first row scheduled) and prefill (first
    # row scheduled -> first token). A preemption before the first token stays inside prefill.

    @property
    def preparing_ms(self) -> float | None:
        if self.t_prepared is None:
            return None
        return (self.t_prepared - self.t_submit) * 1000.0

    @property
    def queue_ms(self) -> float | None:
        """Waiting for a slot, KV room or prompt rows, after preparing (from submit when the
        request was never prepared here)."""
        if self.t_first_scheduled is None:
            return None
        start = self.t_prepared if self.t_prepared is not None else self.t_submit
        return (self.t_first_scheduled - start) * 1000.0

    @property
    def prefill_ms(self) -> float | None:
        if self.t_first_token is None or self.t_first_scheduled is None:
            return None
        return (self.t_first_token - self.t_first_scheduled) * 1000.0

    @property
    def ttft_ms(self) -> float | None:
        if self.t_first_token is None:
            return None
        return (self.t_first_token - self.t_submit) * 1000.0

    def live_tok_s(self, now: float) -> float | None:
        """Tokens per second over the last LIVE_WINDOW_S (or since the first token, if sooner)."""
        if self.t_first_token is None:
            return None
        window = min(LIVE_WINDOW_S, now - self.t_first_token)
        if window <= 0:
            return None
        cutoff = now - window
        recent = self._recent
        if not self._recent_in_order:
            return sum(1 for t in recent if t > cutoff) / window
        old = 0  # the tokens at or before the cutoff lead the window
        for t in recent:
            if t > cutoff:
                break
            old += 1
        return (len(recent) - old) / window

    @property
    def final_tok_s(self) -> float | None:
        """Decode rate from first to last token; TTFT is reported apart, never folded in."""
        if (self.num_tokens < 2 or self.t_first_token is None or self.t_last_token is None
                or self.t_last_token == self.t_first_token):
            return None
        return (self.num_tokens - 1) / (self.t_last_token - self.t_first_token)

    @property
    def itl_p50_ms(self) -> float | None:
        return observed_percentile(self._itl_sorted, 50)

    @property
    def itl_p95_ms(self) -> float | None:
        return observed_percentile(self._itl_sorted, 95)

    @property
    def itl_max_ms(self) -> float | None:
        return self._itl_sorted[-1] if self._itl_sorted else None

    @property
    def itls_ms(self) -> list[float]:
        return list(self._itl_sorted)
