"""Provides the `bench soak` scenarios that drive an Engine in this process: the random-walk state
machine (fake backend and real model), bad inputs beside good ones, and a flood of 64 requests."""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from dataclasses import replace
from typing import Callable

from magnitude_tui.engine.warm_store import WarmStore
from magnitude_tui.reliability.config import SoakConfig, soak_row
from scheduler.stats import percentile, rnd

# ---- state machines --------------------------------------------------------------------------

def _walk(scenario: str, make_engine: Callable[[], object], ops: int, seed: int, *, exact_cells: bool,
          one_char: bool, progress) -> tuple[dict, list[str]]:
    """Random operations until `ops` are done, in episodes of ~2,000 closed and checked empty;
    the scenario's row and failures."""
    from magnitude_tui.reliability.machine import EngineHarness, InvariantViolation

    rng = random.Random(seed)
    done = steps = preempted = lost = 0
    failures: list[str] = []
    leaked = [0, 0]
    finished: dict[str, int] = {}
    restores: dict[str, int] = {}
    t0 = time.monotonic()
    while done < ops:
        h = EngineHarness(make_engine(), exact_cells=exact_cells, one_char_per_token=one_char)
        try:
            while h.stats.ops < min(2_000, ops - done):
                h.random_op(rng)
            h.finish()
        except InvariantViolation as e:
            failures.append(str(e)[:300])
        cells, slots = h.leaked()
        leaked[0] += cells
        leaked[1] += slots
        done += h.stats.ops
        steps += h.stats.steps
        preempted += h.stats.preemptions
        lost += h.stats.lost_tokens
        for k, v in h.stats.finished.items():
            finished[k] = finished.get(k, 0) + v
        for k, v in h.stats.restores.items():
            restores[k] = restores.get(k, 0) + v
        progress(f"  {done:,}/{ops:,} operations, {len(failures)} failures")
    return soak_row(scenario, f"{ops:,} ops", len(failures), f"{leaked[0]}/{leaked[1]}", f"{lost} tokens",
                    steps=steps, requests=sum(finished.values()), preemptions=preempted, done_reasons=finished,
                    warm_restores=restores, seconds=rnd(time.monotonic() - t0, 1)), failures


def machine_fake(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from backend.fake import FakeBackend
    from backend.simulated import VirtualClock
    from magnitude_tui.engine.core import Engine

    shapes = random.Random(cfg.seed)  # each episode: another slot count and end-of-generation

    kv_dir = tempfile.mkdtemp(prefix="magnitude-soak-kv-")

    def make():
        rng = shapes
        backend = FakeBackend(n_ctx=700, n_seq_max=rng.choice([3, 5, 8]), n_batch=96,
                              eog_after=rng.choice([None, 12]))
        engine = Engine(backend, policy="fixed:32", clock=VirtualClock(), coalesce_ms=0, gen_reserve=24,
                        warm=WarmStore(kv_dir, layout=backend.state_layout, budget_bytes=8 << 20))
        assert engine.warm is not None
        engine.warm.save_after_s = 0.0  # saved as soon as idle: conversations swap to disk and back often
        return engine

    try:
        return _walk("state machine, fake backend", make, cfg.fake_ops, cfg.seed, exact_cells=True,
                     one_char=True, progress=progress)
    finally:
        shutil.rmtree(kv_dir, ignore_errors=True)


def machine_real(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from backend.factory import BackendConfig, build_backend, reset_kv
    from magnitude_tui.engine.core import Engine

    backend = build_backend(BackendConfig("llama", model=cfg.model, device=cfg.device, n_ctx=2048, n_seq_max=6,
                                          n_batch=512))
    kv_dir = tempfile.mkdtemp(prefix="magnitude-soak-kv-")
    try:
        def make():
            reset_kv(backend)
            engine = Engine(backend, policy="target:50", coalesce_ms=0, gen_reserve=16,
                            warm=WarmStore(kv_dir, layout=backend.state_layout, budget_bytes=256 << 20))
            assert engine.warm is not None
            engine.warm.save_after_s = 0.0  # llama.cpp's sequence states go out and back in under load
            return engine

        return _walk("state machine, real model", make, cfg.real_ops, cfg.seed, exact_cells=False,
                     one_char=False, progress=progress)
    finally:
        backend.close()
        shutil.rmtree(kv_dir, ignore_errors=True)

# ---- bad inputs and flood --------------------------------------------------------------------

def bad_inputs(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    """Every malformed request beside good ones; the good ones must finish untouched."""
    from backend.fake import DEFAULT_REPLY, FakeBackend
    from backend.simulated import VirtualClock
    from magnitude_tui.engine.core import Engine
    from magnitude_tui.reliability.cases import BAD_REQUESTS
    from scheduler.types import DoneReason, Message, Request, SamplingParams

    failures: list[str] = []
    n = 0
    for round_no in range(cfg.bad_rounds):
        engine = Engine(FakeBackend(n_ctx=1024), policy="fixed:64", clock=VirtualClock(), coalesce_ms=0)
        for name, (bad, _) in BAD_REQUESTS.items():
            engine.submit(Request(f"good-{name}", f"g-{name}", (Message("user", "hello"),),
                                  SamplingParams(max_tokens=10)))
            engine.submit(replace(bad, request_id=f"bad-{name}", session_id=f"b-{name}"))
            n += 1
        seen: dict[str, list] = {}
        for report in engine.run_until_idle():
            for u in report.updates:
                seen.setdefault(u.request_id, []).append(u)
        for name, (_, words) in BAD_REQUESTS.items():
            good, bad_ = seen.get(f"good-{name}", []), seen.get(f"bad-{name}", [])
            if not good or good[-1].done_reason is not DoneReason.LENGTH or \
                    "".join(u.text_delta for u in good) != DEFAULT_REPLY[:10]:
                failures.append(f"round {round_no}: the good request beside '{name}' did not complete")
            if not bad_ or bad_[-1].done_reason is not DoneReason.ERROR or words not in (bad_[-1].error or ""):
                failures.append(f"round {round_no}: '{name}' did not end with its error")
        for name in BAD_REQUESTS:
            engine.close_session(f"g-{name}")
        engine.run_until_idle()
        if not engine.is_empty():
            failures.append(f"round {round_no}: leaks {engine.leaks()}")
    return soak_row("bad inputs beside good ones", f"{n:,} bad requests ({len(BAD_REQUESTS)} kinds)",
                len(failures), "0/0" if not failures else "see failures", "0"), failures


def flood(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    """64 requests at once on the fake backend: served in order, every one completes."""
    from backend.fake import FakeBackend
    from backend.simulated import VirtualClock
    from magnitude_tui.engine.core import Engine
    from magnitude_tui.engine.events import SeqUpdate
    from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams

    failures: list[str] = []
    queue_steps: list[int] = []
    for round_no in range(cfg.flood_rounds):
        engine = Engine(FakeBackend(n_ctx=16384, n_seq_max=8), policy="fixed:64", clock=VirtualClock(),
                        coalesce_ms=0)
        for i in range(64):
            # Each prompt its own from the first word: prompts that share a long prefix rightly
            # wait for it to be evaluated once (admission), which is not the order this checks.
            text = f"request {i}: " + "word " * (5 + (i * 7) % 40)
            engine.submit(Request(f"r{i:02}", f"s{i:02}", (Message("user", text),),
                                  SamplingParams(max_tokens=8)))
        first: dict[str, int] = {}
        last: dict[str, SeqUpdate] = {}
        for k, report in enumerate(engine.run_until_idle()):
            for u in report.updates:
                last[u.request_id] = u
                # Admitted: it holds a slot (round-robin prefill may then serve it a step later
                # than one admitted after it, which is fair sharing, not overtaking).
                if u.phase in (Phase.PREFILL, Phase.GENERATING) and u.request_id not in first:
                    first[u.request_id] = k
        order = [first.get(f"r{i:02}", 10**9) for i in range(64)]
        if order != sorted(order):
            failures.append(f"round {round_no}: not first come first served: {order}")
        if any(u.done_reason is not DoneReason.LENGTH for u in last.values()) or len(last) != 64:
            failures.append(f"round {round_no}: not every request completed")
        queue_steps += order
        for i in range(64):
            engine.close_session(f"s{i:02}")
        engine.run_until_idle()
        if not engine.is_empty():
            failures.append(f"round {round_no}: leaks {engine.leaks()}")
    return soak_row("flood of 64 requests", f"{cfg.flood_rounds} x 64 requests", len(failures), "0/0", "0",
                admitted_by_step_p95=rnd(percentile(queue_steps, 95), 1),
                admitted_by_step_max=max(queue_steps)), failures
