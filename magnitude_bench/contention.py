"""Provides `bench contention`: the engine's tok/s beside busy processes, against its own quiet
figure and llama-batched-bench at each thread count under the same load, side by side in one run.

Loads: none, one busy process, one busy process per usable core (each a Python spin loop). Under
each load the variants alternate round by round: the engine as `generate --n 8` runs it (one
worker, its thread count chosen between steps), llama-batched-bench `-npp P -ntg G -npl N -kvu` at
`-t 1 .. -t <cores>`, and optionally the engine with its thread count fixed at every core (the
default before the governor). The figure compared is generated tokens over the whole run, prompt
included, for every variant. The engine worker stays up across loads, as in the app, so its
figures include finding the right count after the load changed.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from typing import Callable, Iterator

from magnitude_bench.common import BenchResult, watched
from magnitude_bench.harness import client_run, in_turn, recorded, started
from scheduler.stats import rnd

# ~64 tokens of SmolLM2's chat template around it: the workload of `-npp 64`.
_PROMPT = ("The keeper climbed the stairs of the lighthouse every evening, counted the steps aloud, "
           "and lit the lamp that guided the ships past the reef. Continue the story in detail.")
KEEP_QUIET = 0.4  # the targets: >= 0.4x the engine's quiet tok/s under load...
KEEP_PEER = 0.9  # ... and >= 0.9x llama-batched-bench at its best thread count under the same load


@dataclass(frozen=True)
class ContentionConfig:
    seqs: int = 8
    prompt_tokens: int = 64  # llama-batched-bench -npp (the engine's prompt is about this long)
    gen: int = 32
    reps: int = 2
    loads: tuple[int, ...] | None = None  # busy processes per load; None: 0, 1 and one per core
    peer_threads: tuple[int, ...] | None = None  # llama-batched-bench -t values; None: 1..cores
    engine_fixed: bool = False  # also the engine with every core, fixed (the old default)
    settle_s: float = 2.0  # the busy processes run this long before the first measurement
    peer_limit_s: float = 150.0  # a llama-batched-bench run longer than this is stopped (rate: "<")
    model: str | None = None


ROUND_LIMIT_S = 1800.0  # an engine round not done in this long fails the run


@contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """n processes that each keep one core busy (a browser tab, a build); killed on exit, by pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait()


def _engine_client(cfg: ContentionConfig, *, fixed_threads: int | None):
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig

    backend = BackendConfig("llama", model=cfg.model, device="cpu", n_ctx=4096,
                            n_seq_max=max(16, cfg.seqs), n_threads=fixed_threads)
    return WorkerClient(EngineConfig(backend, auto_threads=fixed_threads is None), log_path="auto")


@dataclass(frozen=True)
class StepSeen:
    """One engine step that ran rows, as its report told it."""

    prefill_rows: int
    step_ms: float
    threads: int | None  # the count it ran on (None: not known yet)


def step_stats(steps: list[StepSeen], wall_s: float) -> dict:
    """Where a round's time went: its steps (llama-batched-bench runs one prompt step and then one
    per generated token), the share of the round inside steps (the rest is the engine's own work
    between them and the trip to the client), and the share spent on a thread count other than the
    one most steps ran on (the governor's probes)."""
    in_steps = sum(s.step_ms for s in steps) / 1000.0
    counts = [s.threads for s in steps if s.threads is not None]
    usual = max(set(counts), key=counts.count) if counts else None
    off = sum(s.step_ms for s in steps if s.threads is not None and s.threads != usual) / 1000.0
    return {"steps": len(steps), "prompt_steps": sum(1 for s in steps if s.prefill_rows),
            "in_steps": in_steps / wall_s if wall_s > 0 else None,
            "probing": off / wall_s if wall_s > 0 else None}


def engine_round(client, cfg: ContentionConfig, tag: str) -> dict:
    """Submit cfg.seqs requests at once (fresh conversations), wait for all; tok/s and threads."""
    from magnitude_tui.engine.events import StepReport
    from scheduler.types import Message, Request, SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.gen)
    sessions = [f"{tag}-{i}" for i in range(cfg.seqs)]
    events: list = []
    tr = client_run(client, [Request(request_id=sid, session_id=sid, messages=(Message("user", _PROMPT),),
                                     sampling=sampling) for sid in sessions],
                    ROUND_LIMIT_S, what="an engine round: ", seen=events)
    for sid in sessions:
        client.close_session(sid)
    threads, counts = None, []
    steps: list[StepSeen] = []
    ran_on = None  # a report's ThreadState is the count for the step after it
    probes: list[str] = []  # why each probe of another thread count started
    for ev in events:
        if isinstance(ev, StepReport) and ev.decode_rows + ev.prefill_rows:
            steps.append(StepSeen(ev.prefill_rows, ev.step_ms, ran_on))
        if isinstance(ev, StepReport) and ev.threads is not None:
            threads = ev.threads
            counts.append(ev.threads.n_threads)
            ran_on = ev.threads.n_threads
            if ev.threads.why.startswith("probing") and ev.threads.why not in probes[-1:]:
                probes.append(ev.threads.why)
    wall, made = tr.wall_s, tr.generated()
    return {"tok_s": made / wall, "made": made, "wall_s": wall,
            "prompt": statistics.median(u.prompt_total for u in tr.final.values()),
            "threads": threads.n_threads if threads else None,
            "threads_mean": statistics.fmean(counts) if counts else None,
            "why": threads.why if threads else "", "probes": probes, **step_stats(steps, wall)}


def peer_round(bindir, cfg: ContentionConfig, threads: int, model: str) -> dict:
    from magnitude_bench import peers

    try:
        rows = peers.batched_bench(bindir, model=model, seqs=[cfg.seqs], prompt=cfg.prompt_tokens, gen=cfg.gen,
                                   threads=threads, n_ctx=2048, n_batch=2048, n_ubatch=512,
                                   dev=peers.device_args("CPU"), timeout_s=cfg.peer_limit_s)
    except subprocess.TimeoutExpired:
        # Too many threads beside busy processes can run 10-30x slower: what it made in the time
        # allowed is at most everything, so its rate is at most this (shown with "<").
        return {"tok_s": cfg.seqs * cfg.gen / cfg.peer_limit_s, "wall_s": cfg.peer_limit_s,
                "made": None, "threads": threads, "timed_out": True}
    row = rows[cfg.seqs]
    return {"tok_s": cfg.seqs * cfg.gen / row["t"], "tg_tok_s": row["speed_tg"], "wall_s": row["t"],
            "made": cfg.seqs * cfg.gen, "threads": threads}


@recorded
def run_contention(cfg: ContentionConfig, progress: Callable[[str], None] = lambda s: None) -> BenchResult:
    from backend import usable_cpus
    from magnitude_bench import peers

    cores = usable_cpus()
    loads = cfg.loads if cfg.loads is not None else tuple(dict.fromkeys((0, 1, cores)))
    peer_threads = cfg.peer_threads or tuple(range(1, cores + 1))
    model = peers.model_path(cfg.model)
    bindir = peers.required_tools("llama-batched-bench")
    clients = {"engine": _engine_client(cfg, fixed_threads=None)}
    if cfg.engine_fixed:
        clients[f"engine -t {cores} fixed"] = _engine_client(cfg, fixed_threads=cores)
    runs: list[dict] = []
    with ExitStack() as stack:
        for c in clients.values():
            stack.enter_context(started(c, 600.0))
        for name, c in clients.items():  # one warm-up round each, on the quiet machine
            engine_round(c, cfg, f"warm-{name[:6]}")
        for load in loads:
            with busy_processes(load) as pids:
                time.sleep(cfg.settle_s)
                for rep in range(cfg.reps):
                    variants: list[tuple[str, Callable[[], dict]]] = [
                        (name, partial(engine_round, c, cfg, f"l{load}r{rep}{name[:6]}"))
                        for name, c in clients.items()]
                    variants += [(f"llama-batched-bench -t {t}", partial(peer_round, bindir, cfg, t, model))
                                 for t in peer_threads]
                    for variant, fn in in_turn(variants, rep):  # neither side always goes first
                        loadavg = os.getloadavg()[0]
                        r, busy = watched(fn, tuple(pids) + tuple(c.pid for c in clients.values() if c.pid))
                        runs.append({"load": load, "rep": rep + 1, "variant": variant, **r,
                                     "others_cores": busy, "loadavg_1m": loadavg})
                        progress(f"{load} busy, rep {rep + 1}: {variant}: {r['tok_s']:.1f} tok/s"
                                 + (f" ({r['threads']} threads)" if variant.startswith("engine") else ""))
    table = summarize(runs, loads, list(clients), cores)
    notes = [
        f"{cfg.seqs} sequences, prompt ~{cfg.prompt_tokens} tokens, {cfg.gen} generated each; tok/s = generated "
        "tokens / the whole run's time (prompt included) for every variant; median of the reps.",
        "busy = Python spin loops started by the bench; others_cores = CPU other processes (neither "
        "the busy loops nor the engine) used during the runs: the machine's background load.",
        f"targets: engine >= {KEEP_QUIET}x its quiet tok/s and >= {KEEP_PEER}x llama-batched-bench at its "
        "best thread count under the same load.",
        f"<x: that llama-batched-bench run was stopped after {cfg.peer_limit_s:.0f} s; its rate was at most x.",
    ]
    return BenchResult(name="contention", title="CPU contention: engine vs llama-batched-bench under load",
                       config=asdict(cfg) | {"cores": cores, "loads": loads, "peer_threads": peer_threads},
                       tables={"contention": table}, notes=notes, data={"runs": runs})


def summarize(runs: list[dict], loads, engines: list[str], cores: int) -> list[dict]:
    def med(load: int, variant: str, key: str = "tok_s") -> float | None:
        xs = [r[key] for r in runs if r["load"] == load and r["variant"] == variant and r.get(key) is not None]
        return statistics.median(xs) if xs else None

    quiet = {e: med(0, e) for e in engines}
    table = []
    for load in loads:
        peers = {r["variant"]: med(load, r["variant"]) for r in runs
                 if r["load"] == load and r["variant"].startswith("llama")}
        # A peer that never finished a run has no figure: it cannot be the best one.
        best_peer = max(((v, tok) for v, tok in peers.items() if tok is not None), key=lambda kv: kv[1],
                        default=(None, None))
        row = {"load": "quiet" if load == 0 else f"{load} busy" + (" (one per core)" if load == cores else ""),
               "loadavg 1m": rnd(statistics.median(r["loadavg_1m"] for r in runs if r["load"] == load), 2),
               "others cores": rnd(statistics.median(r["others_cores"] for r in runs if r["load"] == load), 2)}
        for e in engines:
            tok = med(load, e)
            row[f"{e} tok/s"] = rnd(tok, 1)
            row[f"{e} threads"] = rnd(med(load, e, "threads_mean"), 2)
            row[f"{e} steps"] = rnd(med(load, e, "steps"), 0)
            row[f"{e} time probing"] = rnd(med(load, e, "probing"), 2)
            base = quiet.get(e)
            row[f"{e} vs quiet"] = rnd(tok / base, 2) if tok and base else None
            row[f"{e} vs best peer"] = rnd(tok / best_peer[1], 2) if tok and best_peer[1] else None
        for name, tok in sorted(peers.items()):
            capped = any(r.get("timed_out") for r in runs if r["load"] == load and r["variant"] == name)
            row[f"{name.removeprefix('llama-batched-bench ')} tok/s"] = f"<{tok:.1f}" if capped else rnd(tok, 1)
        row["best peer"] = best_peer[0].removeprefix("llama-batched-bench ") if best_peer[0] else None
        table.append(row)
    return table
