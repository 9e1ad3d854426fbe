"""Provides ThreadGovernor: the engine's CPU thread count, chosen between steps from measured step
times and the load of other processes."""

from __future__ import annotations

import statistics
from collections import deque
from enum import Enum
from typing import Protocol

from magnitude_tui.engine.events import ThreadState

# ggml's CPU threads meet at a spinning barrier after every operation, so one thread sharing its
# core holds up all of them, and only measuring tells which count wins (the figures behind the
# constants below: docs/design/engine.md, "Measurements behind the thread constants").

PROBE_STEPS = 3  # steps measured at each candidate count
# A candidate whose first step took this many times the incumbent's time per unit of predicted work
# is dropped at once (and barred, see PROBE_BUDGET): a step on too many threads can cost tens of
# normal steps on a busy machine, so each probe of it must stay rare.
ABORT_RATIO = 2.0
# What probing may cost: a candidate that lost is not probed again (by slower steps or the periodic
# re-check) until the time it cost beyond the incumbent's is paid back at PROBE_BUDGET of the time
# spent stepping since (at most BAR_MAX_S of it; idle time pays nothing back, or an engine that works
# in bursts would probe in every burst); a change of the count the load suggests lifts that bar.
# A dear probe then waits minutes of work, a cheap one seconds (docs/design/engine.md, CPU threads).
PROBE_BUDGET = 0.02
BAR_MAX_S = 600.0
SWITCH_MARGIN = 0.10  # a candidate must be 10 % faster per unit of work to replace the incumbent
SLOW_RATIO = 1.4  # steps this much slower than calibrated, or than when the count was chosen
MIN_STEPS = 2  # steps at a count before anything is decided (a single step may be an outlier)
RECENT_STEPS = 6  # the incumbent's recent steps kept (a probe compares their last PROBE_STEPS)
MIN_GAP_S = 2.0  # never probe again sooner than this after the last probe ended
REPROBE_S = 15.0  # with nothing pointing at a change, measure the alternatives again after this,
REPROBE_MAX_S = 120.0  # doubling each time the incumbent keeps its place, up to this
LOAD_EVERY_S = 1.0  # how often the load of other processes is read
# Other processes' load moved this many cores since the last probe: measure again, even where the
# count it suggests is the same (two loads that suggest the same count can favour opposite ones).
LOAD_SHIFT = 0.75
# ...measured on a moving average of the 1 s readings (this weight for the newest): a single reading
# swings by a core or more on a shared machine, and a trigger on those probed every few seconds.
LOAD_SMOOTHING = 0.3


class ThreadMode(Enum):
    STEADY = "steady"
    PROBING = "probing"


class LoadReader(Protocol):
    """Cores other processes used since the previous call (None: unknown): backend.cpu_load.CpuLoad,
    made with the cores this process may use, so a CPU-limited container reads None."""

    def others(self) -> float | None: ...


class ThreadGovernor:
    """Chooses the thread count for the next step. Fed every successful step with its measured
    time and the time the calibrated cost model predicts for the same rows (their ratio is the
    step's time per unit of work, comparable across step shapes).

    Steady, it watches the incumbent's steps. It probes (runs each candidate count for a few
    steps) when those steps grow `SLOW_RATIO` slower than when the count was chosen, when the load
    of other processes points at another count or moves by `LOAD_SHIFT`, or every `REPROBE_S`
    (doubling while nothing changes). It keeps whichever count did the most work per second, the
    incumbent unless a candidate was clearly faster; a candidate that is plainly worse is dropped
    after one step.
    A candidate that lost is barred until what its probe cost is paid back (`PROBE_BUDGET`); only a
    change of the load (the count it suggests, or its moving average by `LOAD_SHIFT`) lifts the bar
    sooner (slower steps do not: on a loaded machine they come and go with the neighbours, and each
    re-try of a count it makes much slower costs a whole slow step).
    """

    def __init__(self, *, start: int, max_threads: int, load: LoadReader | None = None,
                 now: float = 0.0) -> None:
        if not 1 <= start <= max_threads:
            raise ValueError(f"start thread count {start} outside 1..{max_threads}")
        self.max_threads = max_threads
        self.n_threads = start
        self.mode = ThreadMode.STEADY
        self._load = load
        self._others: float | None = None
        self._load_at = now
        # The incumbent's latest steps: (time per unit of work, whether the step held prompt rows).
        self._recent: deque[tuple[float, bool]] = deque(maxlen=RECENT_STEPS)
        # The incumbent's time per unit of work when it was chosen, per step shape (prompt rows or
        # decode rows only); at first, its first steps' of that shape. Not the calibration's 1.0:
        # that fit saw narrow, shallow steps, and wider ones ran 1.4x its figure on two threads,
        # which set off a probe at every start. Per shape: the cost model's error differs between
        # them (16 decode rows on two threads ran 2.2x the ratio of the prompt steps before them),
        # and a burst's prompt steps giving way to its decode steps is not a slower machine.
        self._baseline: dict[bool, float] = {}
        self._last_probe_end = now
        self._interval = REPROBE_S
        self._next_probe = now + REPROBE_S
        self._hint_at_probe: int | None = None
        self._others_at_probe: float | None = None
        self._others_avg: float | None = None  # the moving average LOAD_SHIFT is measured on
        self._incumbent = start
        self._candidates: list[int] = []
        self._scores: dict[int, list[tuple[float, bool]]] = {}  # count -> (ratio, prompt) per step
        self._plainly_worse = False  # a candidate of the current probe was dropped after one step
        self._cost_s: dict[int, float] = {}  # each candidate's time beyond the incumbent's, this probe
        self._barred: dict[int, float] = {}  # count -> busy time after which it may be probed again
        self._busy_s = 0.0  # time spent in steps so far: the clock the bars run on
        self._why = "as configured; measuring"

    @property
    def state(self) -> ThreadState:
        return ThreadState(self.n_threads, self.max_threads, self._why, self._others)

    def after_step(self, now: float, step_ms: float, predicted_ms: float, prompt: bool = False) -> int:
        """Record one successful step run at `self.n_threads` (`prompt`: it held prompt rows);
        return the count for the next."""
        if step_ms > 0 and predicted_ms > 0:
            self._busy_s += step_ms / 1000.0
            ratio = step_ms / predicted_ms
            if self.mode is ThreadMode.PROBING:
                self._probe_step(now, ratio, predicted_ms, prompt)
            else:
                self._steady_step(now, ratio, prompt)
        return self.n_threads

    # ---- steady --------------------------------------------------------------------------------

    def _steady_step(self, now: float, ratio: float, prompt: bool) -> None:
        self._recent.append((ratio, prompt))
        self._read_load(now)
        same = [r for r, p in self._recent if p == prompt]  # this step's shape, oldest first
        if self.max_threads <= 1 or len(same) < MIN_STEPS or now - self._last_probe_end < MIN_GAP_S:
            return
        # The last three steps: two slow ones in a row are enough, one outlier is not.
        current = statistics.median(same[-3:])
        baseline = self._baseline.get(prompt)
        if baseline is None:
            if len(same) < PROBE_STEPS:  # not one slow early step and its neighbour
                return
            baseline = self._baseline[prompt] = current
        hint = self.hint()
        if hint is not None and hint != self.n_threads and hint != self._hint_at_probe:
            self._probe_new_load(f"other processes use {self._others:.1f} cores", hint)
        elif current > SLOW_RATIO * baseline:
            if not self._start_probe(f"steps ran {current / baseline:.1f}x slower", hint):
                self._baseline[prompt] = current  # every other count is barred: this is the new normal
        elif self._load_shifted():
            self._probe_new_load(f"other processes went from {self._others_at_probe:.1f} to "
                                 f"{self._others_avg:.1f} cores", hint)
        elif now >= self._next_probe:
            self._start_probe("periodic re-check", hint)  # when every count is barred: later

    def hint(self) -> int | None:
        """The count the load of other processes suggests (None: load unknown)."""
        if self._others is None:
            return None
        return max(1, min(self.max_threads, round(self.max_threads - self._others)))

    def _load_shifted(self) -> bool:
        if self._others_avg is None:
            return False
        if self._others_at_probe is None:
            self._others_at_probe = self._others_avg  # the first reading: nothing to compare with yet
            return False
        return abs(self._others_avg - self._others_at_probe) >= LOAD_SHIFT

    def _read_load(self, now: float) -> None:
        if self._load is not None and now - self._load_at >= LOAD_EVERY_S:
            self._load_at = now
            self._others = self._load.others()
            if self._others is None or self._others_avg is None:
                self._others_avg = self._others
            else:
                self._others_avg += LOAD_SMOOTHING * (self._others - self._others_avg)

    # ---- probing -------------------------------------------------------------------------------

    def _probe_new_load(self, trigger: str, hint: int | None) -> None:
        """The load changed: no bar stands (what the old load made plainly worse may not be now),
        and the incumbent is measured again under the new load before it is compared."""
        self._barred.clear()
        self._start_probe(trigger, hint, fresh=True)

    def _start_probe(self, trigger: str, hint: int | None, fresh: bool = False) -> bool:
        """Start measuring the candidates; False (nothing started) when every one is barred.
        `fresh` (the load changed): the incumbent's recent steps may have run under the old load
        (before an idle gap, say), so it is measured again first and compared on those steps."""
        self._barred = {n: until for n, until in self._barred.items() if until > self._busy_s}
        others = [n for n in range(1, self.max_threads + 1) if n != self.n_threads and n not in self._barred]
        if not others:
            return False
        self._incumbent = self.n_threads
        self._hint_at_probe = hint
        self._others_at_probe = self._others_avg
        target = hint if hint is not None else self.n_threads
        # Nearest to what the load suggests first; at most two candidates per probe on many cores.
        self._candidates = sorted(others, key=lambda n: (abs(n - target), n))[:2]
        self._scores = {self._incumbent: [] if fresh else list(self._recent)[-PROBE_STEPS:]}
        self._plainly_worse = False
        self._cost_s = {}
        self.mode = ThreadMode.PROBING
        if fresh:
            self._why = f"measuring {self.n_threads} again ({trigger})"
        else:
            self.n_threads = self._candidates.pop(0)
            self._why = f"probing {self.n_threads} ({trigger})"
        return True

    def _probe_step(self, now: float, ratio: float, predicted_ms: float, prompt: bool) -> None:
        samples = self._scores.setdefault(self.n_threads, [])
        samples.append((ratio, prompt))
        if self.n_threads == self._incumbent:  # measured again under a new load
            if len(samples) >= PROBE_STEPS:
                self.n_threads = self._candidates.pop(0)
                self._why = f"probing {self.n_threads}"
            return
        incumbent = statistics.median(r for r, _ in self._scores[self._incumbent])
        extra_s = max(0.0, ratio - incumbent) * predicted_ms / 1000.0
        self._cost_s[self.n_threads] = self._cost_s.get(self.n_threads, 0.0) + extra_s
        if ratio > ABORT_RATIO * incumbent:
            self._plainly_worse = True
        elif len(samples) < PROBE_STEPS:
            return
        if self._candidates:
            self.n_threads = self._candidates.pop(0)
            self._why = f"probing {self.n_threads}"
            return
        self._settle(now)

    def _settle(self, now: float) -> None:
        medians = {n: statistics.median(r for r, _ in s) for n, s in self._scores.items()}
        keep = self._incumbent
        best = min(medians, key=lambda n: medians[n])
        if best != keep and medians[best] < (1 - SWITCH_MARGIN) * medians[keep]:
            keep = best
        slower = ", ".join(f"{n} took {medians[n] / medians[keep]:.1f}x as long" for n in sorted(medians)
                           if n != keep)
        if keep != self._incumbent:
            self._interval = REPROBE_S
            self._why = f"fastest measured, switched from {self._incumbent} ({slower})"
        else:
            # After a plainly worse candidate the re-check waits the longest interval, or its bar.
            self._interval = REPROBE_MAX_S if self._plainly_worse else min(REPROBE_MAX_S, self._interval * 2)
            self._why = f"fastest measured ({slower})"
        for n, cost_s in self._cost_s.items():
            if n != keep and cost_s > 0:
                bar_s = min(BAR_MAX_S, cost_s / PROBE_BUDGET)
                self._barred[n] = self._busy_s + bar_s
                if bar_s > REPROBE_MAX_S:
                    self._why += f"; {n} not re-tried for {bar_s:.0f} s of work (its probe cost {cost_s:.1f} s)"
        self.n_threads = keep
        self.mode = ThreadMode.STEADY
        kept = self._scores[keep]
        self._baseline = {shape: statistics.median(r for r, p in kept if p == shape) for shape in {p for _, p in kept}}
        self._recent.clear()
        self._recent.extend(kept[-RECENT_STEPS:])
        self._last_probe_end = now
        self._next_probe = now + self._interval
