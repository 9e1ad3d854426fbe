"""Provides `bench soak`: the reliability scenarios run long, with a table of what broke and what leaked.

Scenarios (each row: operations or duration, failures, leaked KV cells/slots, data lost):
- state machine, fake backend: a seeded random walk of submit / follow-up / fork / cancel / close /
  policy / "no KV slot" / step, the engine's accounting checked after every step (EngineHarness);
- state machine, real model: the same walk on SmolLM2 (no injected KV faults: the real cache fills);
- bad inputs: every malformed request of the catalogue beside a good one, repeatedly;
- flood: 64 requests at once, admitted first come first served, queue time reported;
- worker kill -9: three streaming requests (every other round plus a reused id), SIGKILL, every one
  must end with an error within 1 s, then a restart must serve a new request;
- corrupt databases: random bytes, a damaged half, a truncation, another program's file, a newer
  schema: the store must move the file aside intact (or refuse a newer one) and start;
- corrupt model files: each handed to a real engine worker, which must fail with a reason;
- app kill -9 while 8 panes stream (soak_app.py): at most 1 s of received text lost on resume;
- CPU contention and UI endurance (soak_perf.py): figures against their targets.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable


from magnitude_tui.bench.common import BenchResult, machine_info, percentile, rnd
from magnitude_tui.bench.soak_config import SoakConfig, soak_row
from magnitude_tui.engine.warm_store import WarmStore


# ---- state machines --------------------------------------------------------------------------

def _walk(make_engine: Callable[[], object], ops: int, seed: int, *, exact_cells: bool,
          one_char: bool, progress) -> tuple[dict, list[str]]:
    """Random operations until `ops` are done, in episodes of ~2,000 closed and checked empty."""
    from magnitude_tui.bench.soak_machine import EngineHarness, InvariantViolation

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
    extra = {"steps": steps, "requests": sum(finished.values()), "preemptions": preempted,
             "done_reasons": finished, "warm_restores": restores, "seconds": rnd(time.monotonic() - t0, 1)}
    return {"leaked": leaked, "lost": lost, **extra}, failures


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
        engine.warm.save_after_s = 0.0  # saved as soon as idle: conversations swap to disk and back often
        return engine

    try:
        res, failures = _walk(make, cfg.fake_ops, cfg.seed, exact_cells=True, one_char=True, progress=progress)
    finally:
        shutil.rmtree(kv_dir, ignore_errors=True)
    return soak_row("state machine, fake backend", f"{cfg.fake_ops:,} ops", len(failures),
                f"{res['leaked'][0]}/{res['leaked'][1]}", f"{res['lost']} tokens",
                **{k: v for k, v in res.items() if k not in ("leaked", "lost")}), failures


def machine_real(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from backend.factory import BackendConfig, build_backend
    from magnitude_tui.bench.common import reset_kv
    from magnitude_tui.engine.core import Engine

    backend = build_backend(BackendConfig("llama", model=cfg.model, device=cfg.device, n_ctx=2048, n_seq_max=6,
                                          n_batch=512))
    kv_dir = tempfile.mkdtemp(prefix="magnitude-soak-kv-")
    try:
        def make():
            reset_kv(backend)
            engine = Engine(backend, policy="target:50", coalesce_ms=0, gen_reserve=16,
                            warm=WarmStore(kv_dir, layout=backend.state_layout, budget_bytes=256 << 20))
            engine.warm.save_after_s = 0.0  # llama.cpp's sequence states go out and back in under load
            return engine

        res, failures = _walk(make, cfg.real_ops, cfg.seed, exact_cells=False, one_char=False,
                              progress=progress)
    finally:
        backend.close()
        shutil.rmtree(kv_dir, ignore_errors=True)
    return soak_row("state machine, real model", f"{cfg.real_ops:,} ops", len(failures),
                f"{res['leaked'][0]}/{res['leaked'][1]}", f"{res['lost']} tokens",
                **{k: v for k, v in res.items() if k not in ("leaked", "lost")}), failures


# ---- bad inputs and flood --------------------------------------------------------------------

def bad_inputs(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    """Every malformed request beside good ones; the good ones must finish untouched."""
    from backend.fake import DEFAULT_REPLY, FakeBackend
    from backend.simulated import VirtualClock
    from magnitude_tui.bench.soak_cases import BAD_REQUESTS
    from magnitude_tui.engine.core import Engine
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
    from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams

    failures: list[str] = []
    queue_steps: list[int] = []
    for round_no in range(cfg.flood_rounds):
        engine = Engine(FakeBackend(n_ctx=16384, n_seq_max=8), policy="fixed:64", clock=VirtualClock(),
                        coalesce_ms=0)
        for i in range(64):
            engine.submit(Request(f"r{i:02}", f"s{i:02}", (Message("user", "word " * (5 + (i * 7) % 40)),),
                                  SamplingParams(max_tokens=8)))
        first: dict[str, int] = {}
        last: dict[str, object] = {}
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
        if any(getattr(u, "done_reason", None) is not DoneReason.LENGTH for u in last.values()) or len(last) != 64:
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


# ---- worker kills and databases --------------------------------------------------------------

def kill_loop(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig, EngineFailed, EngineReady
    from scheduler.types import Message, Phase, Request, SamplingParams, SeqUpdate, StepReport

    def updates(batch):
        for ev in batch:
            if isinstance(ev, StepReport):
                yield from ev.updates
            elif isinstance(ev, SeqUpdate):
                yield ev

    def wait(client, cond, timeout):
        seen, t_end = [], time.monotonic() + timeout
        while not cond(seen) and time.monotonic() < t_end:
            seen += client.poll_events(timeout=0.2) or []
        return seen

    failures: list[str] = []
    latencies: list[float] = []
    lost = 0
    t0 = time.monotonic()
    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=1 << 20, n_seq_max=4)), log_path=None)
    client.start()
    try:
        for round_no in range(cfg.kill_rounds):
            if not any(isinstance(e, EngineReady) for e in wait(client, lambda s: any(
                    isinstance(e, EngineReady) for e in s), 60)):
                failures.append(f"round {round_no}: the worker did not (re)start")
                client.restart()
                continue
            live = {f"k{round_no}-{i}" for i in range(3)}
            for rid in sorted(live):
                client.submit(Request(rid, f"s-{rid}", (Message("user", "talk"),),
                                      SamplingParams(max_tokens=1_000_000)))
            wait(client, lambda s: {u.request_id for u in updates(s) if u.phase is Phase.GENERATING} >= live, 30)
            if round_no % 2:
                rid = sorted(live)[0]
                client.submit(Request(rid, "intruder", (Message("user", "me too"),), SamplingParams()))
                wait(client, lambda s: any(isinstance(e, StepReport) and e.rejected for e in s), 10)
            t_kill = time.monotonic()
            os.kill(client.pid, signal.SIGKILL)
            seen = wait(client, lambda s: any(isinstance(e, EngineFailed) for e in s), 10)
            errors = {u.request_id for u in updates(seen) if u.phase is Phase.DONE and u.error}
            latencies.append(time.monotonic() - t_kill)
            if errors != live:
                lost += len(live - errors)
                failures.append(f"round {round_no}: {sorted(live - errors)} never got their error")
            elif latencies[-1] > 1.0:
                failures.append(f"round {round_no}: errors took {latencies[-1]:.2f} s")
            client.restart()
            progress(f"  kill round {round_no + 1}/{cfg.kill_rounds}")
    finally:
        client.stop()
    return soak_row("worker kill -9 and restart", f"{cfg.kill_rounds} kills, {time.monotonic() - t0:.0f} s",
                len(failures), "-", f"{lost} requests without an error",
                error_latency_p50_ms=rnd(1000 * percentile(latencies, 50), 0),
                error_latency_max_ms=rnd(1000 * max(latencies), 0) if latencies else None), failures


def _damage(path: Path, kind: str, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    if kind == "random bytes":
        path.write_bytes(rng.randbytes(len(data)))
    elif kind == "damaged half":
        half = len(data) // 2
        data[half:] = rng.randbytes(len(data) - half)
        path.write_bytes(bytes(data))
    elif kind == "truncated":
        path.write_bytes(bytes(data[: rng.randint(100, len(data) - 1)]))
    elif kind == "another program":
        path.unlink()
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (body TEXT)")
        db.commit()
        db.close()
    elif kind == "newer schema":
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version=99")
        db.close()


DB_DAMAGE = ("random bytes", "damaged half", "truncated", "another program", "newer schema")


def databases(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from magnitude_tui.store import MessageRecord, PaneRecord, Store, StoreError

    rng = random.Random(cfg.seed)
    failures: list[str] = []
    lost = 0
    for i in range(cfg.db_rounds):
        kind = DB_DAMAGE[i % len(DB_DAMAGE)]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.db"
            store = Store(path)
            store.open_workspace(resume=False)
            store.add_pane(PaneRecord("p", "A1"))
            for k in range(rng.randint(1, 300)):
                store.add_message("p", MessageRecord("user", f"m{k} " + "x" * rng.randint(1, 400)))
            store.close()
            _damage(path, kind, rng)
            before = path.read_bytes()
            try:
                store = Store(path)
            except StoreError as e:
                if kind != "newer schema" or path.read_bytes() != before:
                    failures.append(f"{kind}: refused ({e})")
                continue
            moved = [p for p in Path(tmp).iterdir() if ".unreadable-" in p.name and not p.name.endswith(("-wal", "-shm"))]
            intact = len(moved) == 1 and moved[0].read_bytes() == before
            if kind == "newer schema":
                failures.append("newer schema: opened instead of refused")
            elif kind == "truncated" and not moved:
                store.open_workspace(resume=True)  # sqlite may read a truncated file as valid
            elif not intact:
                lost += 1
                failures.append(f"{kind}: the damaged file was not moved aside intact")
            store.close()
    return soak_row("corrupt, foreign and newer databases", f"{cfg.db_rounds} files ({len(DB_DAMAGE)} kinds)",
                len(failures), "-", f"{lost} files"), failures


MODEL_DAMAGE = ("empty file", "random bytes", "zeroed header", "truncated 1%", "truncated 10%",
                "truncated 50%", "truncated 90%")


def model_files(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    """Each damaged GGUF goes to a real engine worker, as the app would send it: the worker must
    end with EngineFailed and a reason (a native abort there is reported too), never hang, and
    the caller must stay up to start the next one."""
    from backend.llama_backend import default_model_path
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig, EngineFailed, EngineReady

    good = Path(cfg.model or default_model_path()).read_bytes()
    rng = random.Random(cfg.seed)
    failures: list[str] = []
    outcomes: dict[str, str] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in MODEL_DAMAGE:
            path = Path(tmp) / f"{kind.replace(' ', '-').replace('%', 'pc')}.gguf"
            if kind == "empty file":
                data = b""
            elif kind == "random bytes":
                data = rng.randbytes(1 << 20)
            elif kind == "zeroed header":
                data = bytes(4096) + good[4096:]
            else:
                data = good[: len(good) * int(kind.split()[1][:-1]) // 100]
            path.write_bytes(data)
            client = WorkerClient(EngineConfig(BackendConfig("llama", model=str(path), device=cfg.device,
                                                             n_ctx=512, n_seq_max=2)),
                                  log_path=str(Path(tmp) / "engine.log"))
            client.start()
            verdict = None
            t_end = time.monotonic() + 120
            try:
                while verdict is None and time.monotonic() < t_end:
                    for ev in client.poll_events(timeout=0.5) or []:
                        if isinstance(ev, EngineFailed):
                            verdict = "error: " + ev.message[:120]
                        elif isinstance(ev, EngineReady):
                            verdict = "loaded"
            finally:
                client.stop()
            outcomes[kind] = verdict or "no answer in 120 s"
            if verdict is None or verdict == "loaded":
                failures.append(f"{kind}: {outcomes[kind]}")
            progress(f"  {kind}: {outcomes[kind]}")
    clean = sum(v.startswith("error: ") for v in outcomes.values())
    progress(f"  e.g. {next(iter(outcomes.values()), '')}")
    return soak_row("corrupt model files, throwaway worker", f"{len(MODEL_DAMAGE)} files, {time.monotonic() - t0:.0f} s",
                len(failures), "-", "-", failed_with_a_reason=f"{clean}/{len(MODEL_DAMAGE)}"), failures


def _app_kill(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from magnitude_tui.bench.soak_app import app_kill

    return app_kill(cfg, progress)


def _contention(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from magnitude_tui.bench.soak_perf import contention

    return contention(cfg, progress)


def _ui_endurance(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from magnitude_tui.bench.soak_perf import ui_endurance

    return ui_endurance(cfg, progress)


# ---- the command -----------------------------------------------------------------------------

SCENARIOS: dict[str, Callable[[SoakConfig, Callable[[str], None]], tuple[dict, list[str]]]] = {
    "machine-fake": machine_fake,
    "machine-real": machine_real,
    "bad-inputs": bad_inputs,
    "flood": flood,
    "kill": kill_loop,
    "databases": databases,
    "model-files": model_files,
    "app-kill": _app_kill,
    "contention": _contention,
    "ui-endurance": _ui_endurance,
}


def run_soak(cfg: SoakConfig, scenarios: tuple[str, ...], progress=lambda s: None) -> BenchResult:
    rows, failures = [], {}
    for name in scenarios:
        progress(f"soak: {name}")
        row, fails = SCENARIOS[name](cfg, progress)
        rows.append(row)
        if fails:
            failures[name] = fails[:20]
    notes = ["failures: scenarios whose promise broke (an invariant violation, a request that did not "
             "end right, a file not moved aside intact); leaked cells/slots: KV cells and sequence slots "
             "still held after every conversation was closed; data lost: tokens generated but not shown "
             "(or shown twice), requests left without their error, damaged files not kept."]
    for name, fails in failures.items():
        notes += [f"{name}: {f}" for f in fails[:5]]
    # One table: every row gets every column (a scenario's own columns are blank elsewhere).
    columns = list(dict.fromkeys(k for r in rows for k in r))
    simple = [{k: (str(r[k]) if isinstance(r.get(k), dict) else r.get(k)) for k in columns} for r in rows]
    return BenchResult(name="soak", title="Reliability soak", config=asdict(cfg), machine=machine_info(),
                       tables={"scenarios": simple}, notes=notes, data={"failures": failures})
