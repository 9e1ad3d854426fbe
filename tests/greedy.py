"""A minimal greedy loop straight over a Backend (no scheduler), for backend tests."""

from __future__ import annotations

from backend.protocol import DecodeOutcome
from scheduler.types import BatchPlan, SeqSlice


def greedy(backend, prompts: dict[int, list[int]], n_tokens: int, margins: dict | None = None) -> dict[int, list[int]]:
    """Prefill every prompt in one batch, then decode all sequences together for n_tokens steps.

    If `margins` is given, it receives per sequence the top-1 minus top-2 logit of every step
    (how close each greedy choice was to a tie), when the backend exposes logits.
    """
    out: dict[int, list[int]] = {s: [] for s in prompts}
    pos = {s: len(p) for s, p in prompts.items()}
    plan = BatchPlan(0, tuple(SeqSlice(s, 0, tuple(p), True, False) for s, p in prompts.items()), 0)
    for step in range(n_tokens):
        res = backend.decode(plan)
        assert res.outcome is DecodeOutcome.OK, res
        slices = []
        for s in prompts:
            if margins is not None:
                row = backend.logits(res.logit_rows[s])
                a, b = sorted(row.argpartition(-2)[-2:], key=lambda i: -row[i])
                margins.setdefault(s, []).append(float(row[a] - row[b]))
            tok = backend.sample(s, res.logit_rows[s])
            out[s].append(tok)
            slices.append(SeqSlice(s, pos[s], (tok,), True, True))
            pos[s] += 1
        plan = BatchPlan(step + 1, tuple(slices), 0)
    return out
