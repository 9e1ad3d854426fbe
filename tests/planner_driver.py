"""The planner tests' driver: a scheduler over the fake backend, requests built from numbers, and
steps whose model output is made by hand (every ready sequence samples TOKEN)."""

from __future__ import annotations

from backend.fake import FakeBackend
from scheduler.planner import Scheduler
from scheduler.sequence import Sequence
from scheduler.types import BatchPlan, DoneReason, Phase, Request, SamplingParams

TOKEN = ord("x")


def make(policy="fixed:32", *, n_ctx=4096, n_seq_max=8, n_batch=512, gen_reserve=64):
    kv = FakeBackend(n_ctx=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch)
    sched = Scheduler(kv, n_ctx=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch, policy=policy,
                      gen_reserve=gen_reserve)
    return sched, kv


def add(sched, rid, n_prompt, *, session=None, max_tokens=1000, fork_from=None, prompt=None):
    # Distinct per conversation (admission shares any idle conversation's prefix, not only a parent's).
    start = sum(map(ord, session or f"s-{rid}")) * 7
    tokens = list(prompt) if prompt is not None else [100 + ((i + start) % 700) for i in range(n_prompt)]
    req = Request(rid, session or f"s-{rid}", (), SamplingParams(max_tokens=max_tokens),
                  fork_from=fork_from, prompt_tokens=tuple(tokens))
    seq = Sequence(req, tokens, t_submit=0.0)
    sched.add(seq)
    return seq


def check(plan: BatchPlan, sched: Scheduler) -> None:
    """Invariants every plan keeps, whatever the policy."""
    assert plan.n_rows <= plan.budget <= sched.n_batch
    seen = [sl.seq_id for sl in plan.slices]
    assert len(seen) == len(set(seen)), "one slice per sequence"
    decode = [sl for sl in plan.slices if sl.is_decode]
    assert plan.slices[: len(decode)] == tuple(decode), "decode rows come first"
    assert [sl.seq_id for sl in decode] == sorted(sl.seq_id for sl in decode), "stable seq-id order"
    assert all(len(sl.tokens) == 1 and sl.want_logits for sl in decode)


def step(sched, kv, *, finish_at=None):
    """One step with hand-made model output: every ready sequence samples TOKEN."""
    plan = sched.schedule()
    if plan is None:
        return None
    check(plan, sched)
    result = kv.decode(plan)
    for seq in sched.postprocess(plan, result):
        sched.append_token(seq, TOKEN)
        if len(seq.output) >= (finish_at or seq.max_tokens):
            sched.finish(seq, DoneReason.LENGTH)
    return plan


def rows(plan):
    return {sl.seq_id: len(sl.tokens) for sl in plan.slices}


def close_all(sched):
    for sid in list(sched.sessions):
        sched.close_session(sid)
    for seq in [*sched.running, *sched.waiting]:
        sched.finish(seq, DoneReason.CANCELLED)
    assert sched.is_empty(), sched.leaks()


def generating(sched, kv, n, prompt=4):
    seqs = [add(sched, f"g{i}", prompt) for i in range(n)]
    while not all(s.phase is Phase.GENERATING for s in seqs):
        step(sched, kv)
    return seqs
