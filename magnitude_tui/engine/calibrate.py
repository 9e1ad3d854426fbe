"""Provides the calibration run that gives the engine's cost model its first figures."""

from __future__ import annotations

from backend.protocol import DecodeOutcome
from scheduler.planner import Scheduler
from scheduler.types import BatchPlan, SeqSlice


def calibration_steps(backend, scheduler: Scheduler, repeats: int = 3):
    """Time prompt chunks of a few sizes and decode steps over 1..4 sequences on free slots (the
    median of `repeats` runs each, since a shared machine is noisy), removing their KV afterwards.
    Yields (decode_rows, prefill_rows, step_ms)."""
    slots = scheduler.free_slots()[:4]
    if not slots:
        return
    sample = [t for t in backend.tokenize("The quick brown fox jumps over the lazy dog. ") if t >= 0]
    sample = sample or [0]
    room = min(scheduler.n_ctx_seq, scheduler.n_ctx // max(1, len(slots))) - 16
    chunks = [n for n in (16, 48, 96) if n <= backend.n_batch]
    if repeats * sum(chunks) + 4 > room:
        chunks = [max(1, room // (4 * repeats))]
    toks = (sample * (1 + max(chunks) // len(sample)))[: max(chunks)]
    pos = {s: 0 for s in slots}

    def run(slices: list[SeqSlice]) -> float | None:
        plan = BatchPlan(step=0, slices=tuple(slices), budget=sum(len(x.tokens) for x in slices))
        result = backend.decode(plan)
        if result.outcome is not DecodeOutcome.OK:
            return None
        for x in slices:
            pos[x.seq_id] += len(x.tokens)
        return result.step_ms

    def median_of(make_slices) -> float | None:
        times = sorted(t for t in (run(make_slices()) for _ in range(repeats)) if t is not None)
        return times[len(times) // 2] if times else None

    try:
        run([SeqSlice(slots[0], 0, tuple(toks[:4]), True, False)])  # warm-up, not timed
        for n in chunks:
            ms = median_of(lambda: [SeqSlice(slots[0], pos[slots[0]], tuple(toks[:n]), True, False)])
            if ms is not None:
                yield 0, n, ms
        for s in slots[1:]:
            run([SeqSlice(s, 0, tuple(toks[:4]), True, False)])
        for k in range(1, len(slots) + 1):
            ms = median_of(lambda: [SeqSlice(s, pos[s], (toks[0],), True, True) for s in slots[:k]])
            if ms is not None:
                yield k, 0, ms
    finally:
        for s in slots:
            backend.kv_remove(s)
