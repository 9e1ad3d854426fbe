"""Provides the `bench soak` scenarios that break things outside the engine: the worker process
killed with SIGKILL and restarted, damaged or foreign databases, damaged model files."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineFailed, SeqUpdate
from magnitude_tui.engine.protocol import EngineClient, seq_updates
from magnitude_tui.engine.waiting import EngineStartFailed, NoEventInTime, events_until, wait_ready
from magnitude_tui.reliability.config import SoakConfig, soak_row
from scheduler.stats import percentile, rnd
from scheduler.types import Phase, SamplingParams

ENDLESS = SamplingParams(max_tokens=1_000_000)  # a reply that is still streaming when the kill comes


# ---- worker kills ------------------------------------------------------------------------------

@dataclass(frozen=True)
class KillOutcome:
    """What a SIGKILL of the engine worker left behind."""

    seconds: float  # from the kill until EngineFailed and every live request's end had arrived
    ended: dict[str, SeqUpdate]  # each live request's done update (it must carry the error)
    failed: EngineFailed | None  # None: the client never reported the death


def kill_worker(client: WorkerClient, live: set[str], timeout_s: float = 10.0) -> KillOutcome:
    """SIGKILL the worker process of `client` while the `live` requests stream, and collect how each
    ended."""
    t_kill = time.monotonic()
    assert client.pid is not None, "the worker is not running"
    os.kill(client.pid, signal.SIGKILL)

    def settled(events) -> bool:
        done = {u.request_id for u in seq_updates(events) if u.phase is Phase.DONE}
        return live <= done and any(isinstance(e, EngineFailed) for e in events)

    try:
        events = events_until(client, settled, timeout_s, what="EngineFailed and every live request's end",
                              poll_s=0.2)
    except NoEventInTime as e:
        events = e.seen
    seconds = time.monotonic() - t_kill
    ended = {u.request_id: u for u in seq_updates(events) if u.phase is Phase.DONE and u.request_id in live}
    return KillOutcome(seconds, ended, next((e for e in events if isinstance(e, EngineFailed)), None))


def _events_within(client: EngineClient, until, timeout_s: float) -> list:
    """events_until, with a timeout left to the checks that follow (they say what went wrong)."""
    try:
        return events_until(client, until, timeout_s, poll_s=0.2)
    except NoEventInTime as e:
        return e.seen


def kill_loop(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    from backend.factory import BackendConfig
    from magnitude_tui.engine.events import EngineConfig, StepReport
    from scheduler.types import Message, Request

    failures: list[str] = []
    latencies: list[float] = []
    lost = 0
    t0 = time.monotonic()
    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=1 << 20, n_seq_max=4)), log_path=None)
    client.start()
    try:
        for round_no in range(cfg.kill_rounds):
            try:
                wait_ready(client, 60)
            except (EngineStartFailed, NoEventInTime) as e:
                failures.append(f"round {round_no}: the worker did not (re)start: {e}")
                client.restart()
                continue
            live = {f"k{round_no}-{i}" for i in range(3)}
            for rid in sorted(live):
                client.submit(Request(rid, f"s-{rid}", (Message("user", "talk"),), ENDLESS))
            _events_within(client, lambda s: {u.request_id for u in seq_updates(s)
                                              if u.phase is Phase.GENERATING} >= live, 30)
            if round_no % 2:
                rid = sorted(live)[0]
                client.submit(Request(rid, "intruder", (Message("user", "me too"),), SamplingParams()))
                _events_within(client, lambda s: any(isinstance(e, StepReport) and e.rejected for e in s), 10)
            killed = kill_worker(client, live)
            errors = {rid for rid, u in killed.ended.items() if u.error}
            latencies.append(killed.seconds)
            if errors != live:
                lost += len(live - errors)
                failures.append(f"round {round_no}: {sorted(live - errors)} never got their error")
            elif killed.seconds > 1.0:
                failures.append(f"round {round_no}: errors took {killed.seconds:.2f} s")
            client.restart()
            progress(f"  kill round {round_no + 1}/{cfg.kill_rounds}")
    finally:
        client.stop()
    p50 = percentile(latencies, 50)  # None when no round ran (kill_rounds 0)
    return soak_row("worker kill -9 and restart", f"{cfg.kill_rounds} kills, {time.monotonic() - t0:.0f} s",
                len(failures), "-", f"{lost} requests without an error",
                error_latency_p50_ms=rnd(1000 * p50, 0) if p50 is not None else None,
                error_latency_max_ms=rnd(1000 * max(latencies), 0) if latencies else None), failures


# ---- damaged files -----------------------------------------------------------------------------

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
    from backend.factory import BackendConfig
    from backend.llama_load import default_model_path
    from magnitude_tui.engine.events import EngineConfig

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
            try:
                wait_ready(client, 120)
                verdict = "loaded"
            except EngineStartFailed as e:
                verdict = "error: " + str(e)[:120]
            except NoEventInTime:
                pass
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
