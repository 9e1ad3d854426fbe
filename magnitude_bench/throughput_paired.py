"""Provides `bench throughput --paired`: the engine and one llama.cpp peer generating at the same
time, each pinned to a core of its own, the cores swapped every repetition.

Run one after another, the sides of a ratio meet a machine whose speed drifts by more than the
gaps measured (on the 2-core machines this project runs on, a one-row step took 17 ms in one hour
and 50 ms in another). Run at once, both share the same minutes: a repetition's ratio is the ratio
of the two sides' medians over runs made while the other side was running too. Both share the
memory bus and caches, so each side's absolute tok/s is lower than alone; the ratio is the figure.

One side per process (spawn), one thread each. Per width, both sides load and warm up, meet at a
barrier, then run: the engine `runs` times per policy (its policies in turn), the peer `runs`
times; each side keeps running until the other has its runs too, and only each side's first runs
count, so every counted run had the other side running beside it. llama-batched-bench loads the
model for every run (its load is not in its time, so the engine runs alone for that moment).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Callable

from backend.factory import BackendConfig
from magnitude_bench import peers
from magnitude_bench.common import loaded
from magnitude_tui.agent.process_group import end_group, group_running
from scheduler.stats import median, rnd

# How long a side waits at a width's start for the other to load and warm up, and the longest a
# pair may take, before the run is abandoned with an error.
BARRIER_S = 300.0
PAIR_S = 3600.0
# A side ended from outside gets this long to unwind and stop its server, then SIGKILL.
END_GRACE_S = 15.0


def default_runs(seqs: int) -> int:
    """Runs per side, policy and width: as many as make each width take about as long."""
    return max(3, 8 // seqs)


@dataclass(frozen=True)
class PairJob:
    """What both sides of one pair need (picklable: it goes to two spawned processes)."""

    spec: BackendConfig
    peer: str  # "batched-bench" or "server"
    seqs: tuple[int, ...]
    prompts: dict[int, list[tuple[int, ...]]]
    gen: int
    policies: tuple[str, ...]
    runs: int  # 0: default_runs per width
    params: Any  # the engine's cost model, calibrated once
    # One engine run: throughput.engine_run (given, not imported: that module runs the pairs).
    engine_run: Callable[..., dict]
    bindir: str
    model: str
    n_ctx: int
    n_batch: int
    n_ubatch: int

    def need(self, seqs: int) -> int:
        return self.runs or default_runs(seqs)


def race(run: Callable[[int], dict], need: int, done, me: int, other: int) -> list[dict]:
    """Run `run(k)` for k = 0, 1, ... until this side has `need` runs and the other side (flag
    `done[other]`) has its own; `done[me]` says so for this side. Returns the runs that count: the
    first `need`, all made while the other side was still running."""
    runs: list[dict] = []
    while True:
        runs.append(run(len(runs)))
        if len(runs) >= need:
            done[me] = 1
        if done[me] and done[other]:
            return runs[:need]


def _engine_side(job: PairJob, n: int, backend) -> Callable[[int], dict]:
    def run(k: int) -> dict:
        policy = job.policies[k % len(job.policies)]
        r = job.engine_run(backend, job.prompts[n], job.gen, policy, params=job.params)
        return {"peer": f"engine {policy}", "tok_s": r["tok_s"], "tg_tok_s": r["tg_tok_s"], "made": r["made"],
                "wall_s": r["wall_s"], "step_ms": r["step_ms"], "native_ms": r["native_ms"]}
    return run


def _peer_side(job: PairJob, n: int, stack: ExitStack) -> Callable[[int], dict]:
    from pathlib import Path

    bindir, dev = Path(job.bindir), peers.device_args("CPU")
    if job.peer == "server":
        srv = stack.enter_context(peers.Server(bindir, model=job.model, parallel=n, threads=1, n_ctx=job.n_ctx,
                                               n_batch=job.n_batch, n_ubatch=job.n_ubatch, dev=dev))
        srv.warm(list(job.prompts[n][0]))

        def serve_run(_: int) -> dict:
            wall, made = srv.burst([list(p) for p in job.prompts[n]], job.gen)
            return {"peer": "llama-server -np N", "tok_s": made / wall, "tg_tok_s": None, "made": made,
                    "wall_s": wall}
        return serve_run
    prompt = len(job.prompts[n][0])

    def bench_run(_: int) -> dict:
        row = peers.batched_bench(bindir, model=job.model, seqs=[n], prompt=prompt, gen=job.gen, threads=1,
                                  n_ctx=job.n_ctx, n_batch=job.n_batch, n_ubatch=job.n_ubatch, dev=dev)[n]
        return {"peer": "llama-batched-bench", "tok_s": n * job.gen / row["t"], "tg_tok_s": row["speed_tg"],
                "made": n * job.gen, "wall_s": row["t"]}
    return bench_run


def side_main(me: int, job: PairJob, core: int, barrier, done, out) -> None:
    """One side of a pair (me: 0 the engine, 1 the peer), in a process of its own on `core`."""
    os.sched_setaffinity(0, {core})  # a server it starts inherits it
    # A group of its own, with the server it starts: a side stopped from outside (a pair that ran
    # over its time, the bench interrupted) is ended whole, and its SIGTERM unwinds it first.
    os.setpgrp()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        rows: list[dict] = []
        with ExitStack() as outer:
            backend = outer.enter_context(loaded(job.spec)) if me == 0 else None
            for w, n in enumerate(job.seqs):
                with ExitStack() as stack:
                    if backend is not None:
                        job.engine_run(backend, job.prompts[n][:1], 4, job.policies[0], params=job.params)  # warm-up
                        run = _engine_side(job, n, backend)
                        need = job.need(n) * len(job.policies)
                    else:
                        run = _peer_side(job, n, stack)
                        need = job.need(n)
                    barrier.wait()
                    # Two flags per width in the shared array: the engine's, then the peer's.
                    counted = race(run, need, done, 2 * w + me, 2 * w + 1 - me)
                    rows += [{**r, "seqs": n, "core": core} for r in counted]
            info = {"attention": backend.info.get("attention")} if backend is not None else {}
        out.put((me, rows, info, None))
    except BaseException as e:  # the other side must not wait at the barrier for this one
        barrier.abort()
        out.put((me, None, {}, f"{type(e).__name__}: {e}"))


def run_pair(job: PairJob, cores: tuple[int, int]) -> tuple[list[dict], list[dict], dict]:
    """Both sides at once (the engine on cores[0], the peer on cores[1]); (engine rows, peer rows,
    the engine's info). RuntimeError with the side's message if either fails."""
    ctx = get_context("spawn")
    barrier = ctx.Barrier(2, timeout=BARRIER_S)
    done = ctx.Array("i", 2 * len(job.seqs))
    out = ctx.Queue()
    procs = [ctx.Process(target=side_main, args=(me, job, cores[me], barrier, done, out), daemon=True)
             for me in (0, 1)]
    for p in procs:
        p.start()
    got: dict[int, tuple] = {}
    try:
        while len(got) < 2:
            try:
                me, rows, info, error = out.get(timeout=PAIR_S)
            except queue.Empty:
                raise RuntimeError(f"a paired run took over {PAIR_S:.0f} s") from None
            if error is not None:
                raise RuntimeError(f"{'the engine' if me == 0 else job.peer} side failed: {error}")
            got[me] = (rows, info)
    finally:
        # Both reported: they are on their way out. Otherwise (a side failed, the pair ran over,
        # the bench was interrupted) nothing is left to wait for: end them now.
        for p in procs:
            p.join(10 if len(got) == 2 else 0)
            if p.pid is not None and (p.is_alive() or group_running(p.pid)):
                asyncio.run(end_group(p.pid, END_GRACE_S))
            if p.is_alive():  # ended before it had a group of its own
                p.kill()
            p.join()
    return got[0][0], got[1][0], got[0][1]


def pair_ratios(engine_rows: list[dict], peer_rows: list[dict], policies: tuple[str, ...]) -> list[dict]:
    """Per width and policy: the engine's median over the peer's median, both from one pair."""
    out = []
    for n in dict.fromkeys(r["seqs"] for r in peer_rows):
        theirs = [r["tok_s"] for r in peer_rows if r["seqs"] == n]
        for policy in policies:
            mine = [r["tok_s"] for r in engine_rows if r["seqs"] == n and r["peer"] == f"engine {policy}"]
            m, t = median(mine), median(theirs)
            if m is not None and t:
                out.append({"seqs": n, "policy": policy, "engine_tok_s": rnd(m, 2), "peer_tok_s": rnd(t, 2),
                            "ratio": rnd(m / t, 4)})
    return out


def two_cores() -> tuple[int, int]:
    """The first two cores this process may use; RuntimeError on fewer."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        raise RuntimeError(f"--paired needs two cores (a core per side); this process may use {len(mine)}")
    return mine[0], mine[1]
