"""Provides the calibration run that gives the engine's cost model its first figures."""

from __future__ import annotations

from backend.protocol import DecodeOutcome
from scheduler.planner import Scheduler
from scheduler.types import AttentionPath, BatchPlan, SeqSlice, attended_kpos, plan_kpos, used_cells_kpos


def calibration_steps(backend, scheduler: Scheduler, repeats: int = 3):
    """Time prompt chunks of a few sizes, decode steps over 1..4 sequences near position 0, and
    the same decode steps and a chunk again deep in a shared prefix, on free slots (the median of
    `repeats` runs each, since a shared machine is noisy), removing their KV afterwards.

    The chunks run one after another on one slot, so they end a few hundred positions deep; the
    other slots then share that prefix (a copy costs no cells), and their decode rows attend over
    it. So the fit sees steps at two depths, and what the attention term costs under the backend's
    attention path. Yields (decode_rows, prefill_rows, step_ms, kpos), kpos priced as the
    scheduler prices it."""
    slots = scheduler.free_slots()[:4]
    if not slots:
        return
    sample = [t for t in backend.tokenize("The quick brown fox jumps over the lazy dog. ") if t >= 0]
    sample = sample or [0]
    room = min(scheduler.n_ctx_seq, scheduler.n_ctx // max(1, len(slots))) - 16
    chunks = [n for n in (16, 48, 96) if n <= backend.n_batch]
    if repeats * (sum(chunks) + 16) + 8 > room:
        chunks = [max(1, room // (5 * repeats))]
    toks = (sample * (1 + max(chunks) // len(sample)))[: max(chunks)]
    pos = {s: 0 for s in slots}
    cells = [0]  # distinct cells resident (the prefix copies share theirs)

    def run(slices: list[SeqSlice]) -> tuple[float, float] | None:
        plan = BatchPlan(step=0, slices=tuple(slices), budget=sum(len(x.tokens) for x in slices))
        kpos = plan_kpos(plan, scheduler.attention, cells[0])
        result = backend.decode(plan)
        if result.outcome is not DecodeOutcome.OK:
            return None
        for x in slices:
            pos[x.seq_id] += len(x.tokens)
        cells[0] += plan.n_rows
        return result.step_ms, kpos

    def median_of(make_slices):
        runs = sorted(r for r in (run(make_slices()) for _ in range(repeats)) if r is not None)
        return runs[len(runs) // 2] if runs else None

    def decode_rows(k: int) -> list[SeqSlice]:
        return [SeqSlice(s, pos[s], (toks[0],), True, True) for s in slots[:k]]

    def steps(label_rows):
        for d, p, make in label_rows:
            got = median_of(make)
            if got is not None:
                yield d, p, got[0], got[1]

    first = slots[0]
    try:
        run([SeqSlice(first, 0, tuple(toks[:4]), True, False)])  # warm-up, not timed
        yield from steps((0, n, lambda n=n: [SeqSlice(first, pos[first], tuple(toks[:n]), True, False)])
                         for n in chunks)
        for s in slots[1:]:
            run([SeqSlice(s, 0, tuple(toks[:4]), True, False)])
        yield from steps((k, 0, lambda k=k: decode_rows(k)) for k in range(1, len(slots) + 1))
        # Deep: every other slot continues from a copy of the first slot's prompt.
        for s in slots[1:]:
            backend.kv_copy(first, s, pos[first])
            pos[s] = pos[first]
        cells[0] = pos[first]
        yield from steps((k, 0, lambda k=k: decode_rows(k)) for k in (1, len(slots)))
        yield from steps([(0, 16, lambda: [SeqSlice(first, pos[first], tuple(toks[:16]), True, False)])])
    finally:
        for s in slots:
            backend.kv_remove(s)
    yield from probe_samples(backend, scheduler.attention)


def probe_samples(backend, path: AttentionPath):
    """The deeper steps the backend's attention probe timed for the path it chose (a real model
    only; read from its cache on later starts), priced as the scheduler prices them."""
    choice = backend.attention
    for d, p, ms, pos0, cells in (choice.deep_samples() if choice is not None else []):
        rows = d + p
        if path is AttentionPath.DENSE:
            kpos = used_cells_kpos(cells + rows, rows)
        else:
            kpos = d * attended_kpos(pos0, 1) + attended_kpos(pos0, p)
        yield d, p, ms, kpos
