"""Provides the app kill -9 scenario of `bench soak`: 8 panes stream, the app process is killed, the
store is reopened. Promise: at most 1 s of received text lost, no duplicate or half-written row.

The child (`python -m magnitude_tui.reliability.app DB LOG`) runs the real app headless with the
engine in process on the fake backend, and appends every 50 ms what each pane has received
(wall time, pane name, characters) to LOG; the parent kills it at a random moment and compares.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PANES = 8


async def _child(db: Path, log: Path) -> None:
    from backend.factory import BackendConfig
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.store import MessageRecord, Store
    from scheduler.types import SamplingParams

    # The simulated GPU profile paces replies in real time (~39 tokens/s a pane), as a user sees them.
    config = EngineConfig(BackendConfig("simulated:rx9070xt", n_ctx=PANES * 30_000, n_seq_max=PANES, realtime=True),
                          policy="fixed:64")
    app = MagnitudeApp(client=WorkerClient(config, in_process=True), store=Store(db),
                       export_dir=db.parent, sampling=SamplingParams(max_tokens=25_000))
    async with app.run_test(size=(160, 50)) as pilot:
        while not app.workspace.engine_ready:
            await pilot.pause(0.05)
        for _ in range(PANES - 1):
            await pilot.press("ctrl+n")
        # Sent as the composer's Enter would, without typing into panes that already stream.
        ws = app.workspace
        for pane in ws.grid.panes:
            await pane.add_message(MessageRecord("user", "go"))
            ws.model.submit_turn(pane)
        with open(log, "a", buffering=1) as out:
            while True:
                await pilot.pause(0.05)
                now = time.time()
                for pane in app.workspace.grid.panes:
                    reply = [m for m in pane.record.messages if m.role == "assistant"]
                    out.write(f"{now:.3f} {pane.record.name} {len(reply[-1].content) if reply else 0}\n")


def _expected(n: int) -> str:
    from backend.fake import DEFAULT_REPLY

    return (DEFAULT_REPLY * (n // len(DEFAULT_REPLY) + 1))[:n]


def one_kill(rng: random.Random, tmp: Path) -> tuple[float, list[str]]:
    """Run the child, kill it mid-stream, reopen the store: (seconds of text lost, problems)."""
    from magnitude_tui.store import Store

    db, log = tmp / "app.db", tmp / "received.log"
    child = subprocess.Popen([sys.executable, "-m", "magnitude_tui.reliability.app", str(db), str(log)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert child.stderr is not None  # stderr=PIPE
    problems: list[str] = []
    t_end = time.monotonic() + 120
    while time.monotonic() < t_end and child.poll() is None:
        names = {line.split()[1] for line in log.read_text().splitlines() if line.split()[2] != "0"} \
            if log.exists() else set()
        if len(names) == PANES:
            break
        time.sleep(0.1)
    if child.poll() is not None:
        return 0.0, [f"the app exited before streaming: {child.stderr.read().decode()[-500:]}"]
    time.sleep(rng.uniform(1.0, 3.0))
    t_kill = time.time()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stderr.close()
    seen: dict[str, list[tuple[float, int]]] = {}
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # the last line may be cut by the kill
            seen.setdefault(parts[1], []).append((float(parts[0]), int(parts[2])))
    store = Store(db)
    panes = store.open_workspace(resume=True)
    store.close()
    lost_s = 0.0
    if len(panes) != PANES:
        problems.append(f"{len(panes)} panes restored, {PANES} were open")
    for pane in panes:
        roles = [m.role for m in pane.messages]
        if roles != ["user", "assistant"]:
            problems.append(f"{pane.name}: rows {roles} (duplicates or missing)")
            continue
        text = pane.messages[1].content
        if text != _expected(len(text)):
            problems.append(f"{pane.name}: the saved reply is not what was streamed (half-written?)")
        # The moment the app had received as much as was saved: everything after it was lost.
        had = [t for t, n in seen.get(pane.name, []) if n <= len(text)]
        last = seen.get(pane.name, [(t_kill, 0)])[-1]
        if last[1] > len(text):
            lost_s = max(lost_s, t_kill - (max(had) if had else 0.0))
    return lost_s, problems


def app_kill(cfg, progress) -> tuple[dict, list[str]]:
    from magnitude_tui.reliability.config import soak_row
    from scheduler.stats import percentile, rnd

    rng = random.Random(cfg.seed)
    failures: list[str] = []
    losses: list[float] = []
    t0 = time.monotonic()
    for i in range(cfg.app_kill_rounds):
        with tempfile.TemporaryDirectory() as tmp:
            lost_s, problems = one_kill(rng, Path(tmp))
        losses.append(lost_s)
        failures += [f"round {i}: {p}" for p in problems]
        if lost_s > 1.0:
            failures.append(f"round {i}: {lost_s:.2f} s of received text lost")
        progress(f"  app kill {i + 1}/{cfg.app_kill_rounds}: {lost_s:.2f} s lost")
    return soak_row(f"app kill -9 while {PANES} panes stream", f"{cfg.app_kill_rounds} kills, "
                f"{time.monotonic() - t0:.0f} s", len(failures), "-",
                f"max {max(losses, default=0):.2f} s of text", lost_s_p50=rnd(percentile(losses, 50), 2)), failures


if __name__ == "__main__":
    asyncio.run(_child(Path(sys.argv[1]), Path(sys.argv[2])))
