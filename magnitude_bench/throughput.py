"""Provides `bench throughput`: aggregate tok/s of this engine against llama.cpp's tools and serial Llama."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from backend.factory import BackendConfig, build_backend
from magnitude_bench import peers
from magnitude_bench.common import (
    CPU_CLOCK,
    OTHERS_NOTE,
    BenchResult,
    backend_info,
    loaded,
    measured,
    prompt_tokens,
)
from magnitude_bench.harness import Drive, in_turn, recorded
from magnitude_bench.throughput_paired import PairJob, pair_ratios, run_pair, two_cores
from scheduler.speculation import SpecMode
from scheduler.stats import median, rnd
from scheduler.types import Priority, Request, SamplingParams

PEERS = ("batched-bench", "server", "serial")
SHORT = {"llama-batched-bench": "batched-bench", "llama-server -np N": "server", "Llama serial": "serial"}


@dataclass(frozen=True)
class ThroughputConfig:
    seqs: tuple[int, ...] = (1, 2, 4, 8, 16)
    prompt: int = 64
    gen: int = 128
    reps: int = 3
    policies: tuple[str, ...] = ("target:50", "fixed:2048")  # the first is "this engine" in the ratios
    peers: tuple[str, ...] = PEERS
    require_tools: bool = False  # fail instead of skipping llama.cpp's tools when they are not built
    profile: bool = False  # cProfile one engine run at `profile_seqs`
    profile_seqs: int = 8
    # The engine's runs in CPU seconds of this process (one thread: every step computes on it),
    # the work done whatever else a shared machine runs; the peers keep their wall figures.
    cpu_clock: bool = False
    # The engine's --spec: off by default, so its rows are the work llama.cpp's tools do (none of
    # them speculates); auto shows what drafting adds or costs on the same runs.
    spec: SpecMode = SpecMode.OFF
    # Whose requests these are: agents by default (what `serve` makes of API calls, as the peers
    # receive them); `interactive` runs them as a person's turns, paced by the step target.
    priority: Priority = Priority.AGENT
    # The engine and each llama.cpp peer at the same time, a core each (one thread per side), the
    # cores swapped every repetition (throughput_paired.py); `pair_runs` runs per side, policy and
    # width (0: throughput_paired.default_runs).
    paired: bool = False
    pair_runs: int = 0


# A policy written "target:50+defaults" runs the engine as the app launches it (--spec auto, the
# thread governor on) instead of with both off.
APP_DEFAULTS = "defaults"


def engine_run(backend, prompts: list[tuple[int, ...]], gen: int, policy: str, cpu_clock: bool = False,
               spec: SpecMode = SpecMode.OFF, priority: Priority = Priority.AGENT, params=None) -> dict:
    """All prompts submitted at once, run to the end; wall time (or CPU time, `cpu_clock`) plus
    per-step Python vs native time. `params`: the cost model of an engine that has been up a while
    (calibrated at the warm-up): a fresh one's first steps would also pay the ramp that guards a
    fit not yet borne out (scheduler.md), once per launch, not once per burst."""
    policy, _, variant = policy.partition("+")
    # The app's launch defaults: speculation auto and, when it is not given a thread count, the
    # thread governor (it never goes past the count the peers run with: at one thread it has nothing
    # to choose, as `--threads 1` turns it off in the app).
    governed = variant == APP_DEFAULTS and backend.n_threads > 1
    if variant == APP_DEFAULTS:
        spec = SpecMode.AUTO
    drive = Drive(backend, policy=policy, gen_reserve=gen, clock=CPU_CLOCK if cpu_clock else None, spec=spec,
                  params=params, auto_threads=governed)
    params = drive.params
    drive.view.decode_ms.clear()
    sampling = SamplingParams(temperature=0.0, max_tokens=gen)
    tr = drive.run([Request(request_id=f"r{i}", session_id=f"r{i}", messages=(), sampling=sampling, prompt_tokens=p,
                            priority=priority) for i, p in enumerate(prompts)])
    drive.close()
    wall, made = tr.wall_s, tr.made()
    tg = tr.decode_tok_s(made, len(prompts))
    decoded = [s for s in tr.steps if s.native_ms is not None]
    return {"wall_s": wall, "made": made, "tok_s": made / wall, "tg_tok_s": tg, "steps": len(decoded), "params": params,
            "step_ms": [s.host_ms for s in decoded], "native_ms": [s.native_ms for s in decoded]}


def profile_engine(backend, prompts, gen: int, policy: str) -> list[dict]:
    """cProfile of one engine run: the functions with the most own time."""
    prof = cProfile.Profile()
    prof.enable()
    engine_run(backend, prompts, gen, policy)
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = [{"function": f"{file.rsplit('/', 2)[-1] if '/' in file else file}:{line}:{fn}",
             "calls": ncalls, "own_s": round(tottime, 3), "cum_s": round(cumtime, 3)}
            for (file, line, fn), (_, ncalls, tottime, cumtime, _) in stats.stats.items()]  # type: ignore[attr-defined]
    return sorted(rows, key=lambda r: -r["own_s"])[:15]


def engine_rep(backend, prompts: dict, cfg: ThroughputConfig, params, rep: int, progress=lambda s: None):
    """One repetition of the engine side: every policy (in turn) at every width. Returns the run
    rows and, per width, the first policy's step and native decode times."""
    out: list[dict] = []
    steps: dict[int, tuple[list, list]] = {}
    for policy in in_turn(cfg.policies, rep):
        for n in cfg.seqs:
            r, busy = measured(lambda: engine_run(backend, prompts[n], cfg.gen, policy, cfg.cpu_clock, cfg.spec,
                                                  cfg.priority, params), progress=progress)
            out.append({"peer": f"engine {policy}", "seqs": n, "rep": rep, "tok_s": r["tok_s"],
                        "tg_tok_s": r["tg_tok_s"], "made": r["made"], "wall_s": r["wall_s"], "others": busy})
            if policy == cfg.policies[0]:
                steps[n] = (r["step_ms"], r["native_ms"])
    return out, steps


def engine_rep_fresh(spec: BackendConfig, prompts: dict, cfg: ThroughputConfig, params, rep: int):
    """`engine_rep` in this (fresh) process, on its own load of the model."""
    with loaded(spec) as backend:
        engine_run(backend, prompts[cfg.seqs[0]], 4, cfg.policies[0], cfg.cpu_clock, params=params)  # warm-up
        return engine_rep(backend, prompts, cfg, params, rep)


def _n_batch(spec: BackendConfig) -> int:
    """The batch every side runs with: the engine's, or llama.cpp's default where it sets none."""
    return spec.n_batch or 2048


@dataclass
class _Setup:
    """What every repetition of a throughput run shares: the engine's load, its prompts and
    warm-up calibration, and where the peers' tools and model are."""

    spec: BackendConfig
    cfg: ThroughputConfig
    backend: Any
    prompts: dict
    params: Any
    bindir: Path | None
    model: str | None
    n_ctx: int
    threads: int
    dev: Any
    serial: Any
    progress: Callable[[str], None]
    runs: list[dict] = field(default_factory=list)  # one per (peer, seqs, rep); paired: one per counted run
    engine_steps: dict[int, dict] = field(default_factory=lambda: defaultdict(lambda: {"step_ms": [], "native_ms": []}))

    def add(self, peer: str, n: int, rep: int, made: int, wall: float, busy: float, tg: float | None = None) -> None:
        self.runs.append({"peer": peer, "seqs": n, "rep": rep, "tok_s": made / wall, "tg_tok_s": tg, "made": made,
                          "wall_s": wall, "others": busy})

    def add_steps(self, n: int, step_ms: list, native_ms: list) -> None:
        self.engine_steps[n]["step_ms"] += step_ms
        self.engine_steps[n]["native_ms"] += native_ms


@recorded
def run_throughput(spec: BackendConfig, cfg: ThroughputConfig, progress=lambda s: None) -> BenchResult:
    n_ctx = spec.n_ctx or max(8192, max(cfg.seqs) * (cfg.prompt + cfg.gen) + 256)
    spec = BackendConfig(**{**asdict(spec), "n_ctx": n_ctx, "n_seq_max": max(spec.n_seq_max, max(cfg.seqs))})
    backend = build_backend(spec)
    threads = backend.n_threads or 1
    model = peers.model_path(spec.model) if spec.family == "llama" else spec.model
    res = BenchResult(name="throughput", title="bench throughput: aggregate generated tok/s, same work for every peer",
                      config={"throughput": asdict(cfg), "backend": asdict(spec)})
    found = peers.tools_dir() if not spec.simulated else None
    wanted = [p for p in cfg.peers if not spec.simulated]
    if not found and any(p in wanted for p in ("batched-bench", "server")):
        msg = "llama.cpp tools are not built: run scripts/build_llama_tools.sh (peers skipped)"
        if cfg.require_tools:
            raise peers.PeerError(msg)
        res.notes.append(msg)
        wanted = [p for p in wanted if p == "serial"]
    if cfg.paired:
        try:
            check_paired(spec, wanted, threads)
        except Exception:
            backend.close()
            raise
    dev = peers.device_args(backend.device_name)
    serial = None
    if "serial" in wanted:
        assert model is not None, "the peers run the llama.cpp model"
        serial = peers.SerialLlama(model=model, threads=threads, n_ctx=cfg.prompt + cfg.gen + 16,
                                   n_batch=_n_batch(spec), n_ubatch=spec.n_ubatch,
                                   cpu=dev[1] == "none")
        serial.answer(list(prompt_tokens(backend, cfg.prompt, salt=999)), 4)  # warm-up
    prompts = {n: [prompt_tokens(backend, cfg.prompt, salt=i + 1) for i in range(n)] for n in cfg.seqs}
    pairs: list[dict] = []  # paired: per repetition, peer, width and policy, the engine ÷ the peer
    try:
        # Warm-up; its calibration serves every run (an engine that has been up a while).
        params = engine_run(backend, prompts[cfg.seqs[0]], 8, cfg.policies[0], cfg.cpu_clock)["params"]
        s = _Setup(spec, cfg, backend, prompts, params, found[0] if found else None, model, n_ctx, threads,
                   dev, serial, progress)
        if cfg.paired:
            pairs = _paired_reps(s, wanted)
        else:
            _sequential_reps(s, wanted)
        if cfg.profile:
            n = cfg.profile_seqs
            res.tables[f"cProfile of one engine run ({n} seqs, {cfg.policies[0]}): most own time"] = \
                profile_engine(backend, prompts[n], cfg.gen, cfg.policies[0])
    finally:
        if serial is not None:
            serial.close()
        # The engine's attention path: the peers run llama.cpp's default (-fa auto: flash attention
        # wherever the device has it, the CPU included), the app the path measured faster here.
        info = backend_info(backend) | {"attention": backend.info.get("attention")}
        backend.close()
    _tables(res, s.runs, s.engine_steps, cfg, info, found)
    if cfg.paired:
        _paired_tables(res, pairs, cfg)
    if info["attention"]:
        chosen = " (--flash-attn auto: the app's choice)" if spec.flash_attn == "auto" else ""
        res.notes.append(f"the engine's attention path: {info['attention']}{chosen}; the peers run llama.cpp's "
                         "default, -fa auto (flash attention wherever the device has it, the CPU included)")
    if cfg.cpu_clock:
        res.notes.append("the engine's tok/s are per CPU second of its process (one thread: every step "
                         "computes on it); the peers' are per wall second")
    return res


def _sequential_reps(s: _Setup, wanted: list[str]) -> None:
    """Every repetition, each side after the other: repetitions outermost and every peer inside
    each one, in turn (every other repetition reversed), so a noisy neighbour, or a machine whose
    speed drifts, hits all of them alike."""
    cfg = s.cfg

    def engine_block(rep: int) -> None:
        if s.spec.simulated:  # a profile's virtual clock: no process to be slow in
            out, steps = engine_rep(s.backend, s.prompts, cfg, s.params, rep, s.progress)
        else:
            # A fresh process per repetition, as each peer run gets: this machine runs one
            # process's native steps at one of two speeds (docs/BENCHMARKS.md, issue 28), and
            # the loaded model of one long-lived process would draw once for every repetition.
            with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
                out, steps = pool.submit(engine_rep_fresh, s.spec, s.prompts, cfg, s.params, rep).result()
        s.runs.extend(out)
        for n, (step_ms, native_ms) in steps.items():
            s.add_steps(n, step_ms, native_ms)

    def batched_block(rep: int) -> None:
        bindir, model = s.bindir, s.model
        assert bindir is not None and model is not None
        bb, busy = measured(lambda: peers.batched_bench(
            bindir, model=model, seqs=list(cfg.seqs), prompt=cfg.prompt, gen=cfg.gen, threads=s.threads,
            n_ctx=s.n_ctx, n_batch=_n_batch(s.spec), n_ubatch=s.spec.n_ubatch, dev=s.dev), progress=s.progress)
        for n, row in bb.items():
            s.add("llama-batched-bench", n, rep, n * cfg.gen, row["t"], busy, row["speed_tg"])

    def server_block(rep: int) -> None:
        assert s.bindir is not None and s.model is not None
        for n in cfg.seqs:
            with peers.Server(s.bindir, model=s.model, parallel=n, threads=s.threads, n_ctx=s.n_ctx,
                              n_batch=_n_batch(s.spec), n_ubatch=s.spec.n_ubatch, dev=s.dev) as srv:
                srv.warm(list(s.prompts[n][0]))
                (wall, made), busy = measured(lambda: srv.burst([list(p) for p in s.prompts[n]], cfg.gen),
                                              pids=(srv.pid,) if srv.pid else (), progress=s.progress)
            s.add("llama-server -np N", n, rep, made, wall, busy)

    def serial_block(rep: int) -> None:
        assert s.serial is not None
        for n in cfg.seqs:
            (wall, made), busy = measured(lambda: s.serial.serial([list(p) for p in s.prompts[n]], cfg.gen),
                                          progress=s.progress)
            s.add("Llama serial", n, rep, made, wall, busy)

    blocks = [engine_block, *([batched_block] if "batched-bench" in wanted else []),
              *([server_block] if "server" in wanted else []), *([serial_block] if s.serial is not None else [])]
    for rep in range(cfg.reps):
        for block in in_turn(blocks, rep):
            block(rep)
        s.progress(f"rep {rep + 1}/{cfg.reps} done: " + ", ".join(
            f"{x['peer']}@{x['seqs']}={x['tok_s']:.1f}" for x in s.runs if x["rep"] == rep and x["seqs"] == 8))


def paired_problem(threads: int | None, peers: tuple[str, ...] | list[str]) -> str | None:
    """Why a paired run cannot be made as asked (None: it can): one thread per side, llama.cpp's
    tools as the only peers."""
    if threads != 1:
        return f"a paired run gives each side one core: run it with --threads 1 (got {threads})"
    if "serial" in peers or not peers:
        return "a paired run pairs the engine with llama.cpp's tools: --peers batched-bench,server (not serial)"
    return None


def check_paired(spec: BackendConfig, wanted: list[str], threads: int) -> None:
    """ValueError unless a paired run can be made as asked (paired_problem), on a real model
    (RuntimeError without two cores)."""
    if spec.simulated:
        raise ValueError("--paired runs real processes side by side; a simulated backend has none")
    problem = paired_problem(threads, wanted)
    if problem:
        raise ValueError(problem)
    two_cores()


def _paired_reps(s: _Setup, wanted: list[str]) -> list[dict]:
    """Every repetition of --paired: the engine against each peer in turn, both at once, the cores
    swapped every repetition. Adds the counted runs and the engine's step times to `s`; returns
    the pairs' ratios."""
    cfg = s.cfg
    assert s.bindir is not None and s.model is not None
    pairs = []
    for rep in range(cfg.reps):
        cores = two_cores()
        if rep % 2:
            cores = (cores[1], cores[0])
        for peer in in_turn(wanted, rep):
            job = PairJob(spec=s.spec, peer=peer, seqs=cfg.seqs, prompts=s.prompts, gen=cfg.gen,
                          policies=cfg.policies, runs=cfg.pair_runs, params=s.params, engine_run=engine_run,
                          bindir=str(s.bindir), model=s.model, n_ctx=s.n_ctx, n_batch=_n_batch(s.spec),
                          n_ubatch=s.spec.n_ubatch)
            (mine, theirs, _), busy = measured(lambda: run_pair(job, cores), progress=s.progress)
            label = theirs[0]["peer"]
            for r in mine:
                if r["peer"] == f"engine {cfg.policies[0]}":
                    s.add_steps(r["seqs"], r["step_ms"], r["native_ms"])
            for r, other in [*((r, label) for r in mine), *((r, "engine") for r in theirs)]:
                s.runs.append({k: v for k, v in r.items() if k not in ("step_ms", "native_ms")}
                              | {"rep": rep, "others": busy, "paired_with": other})
            got = pair_ratios(mine, theirs, cfg.policies)
            pairs += [{"rep": rep, "peer": label, "engine_core": cores[0], **g} for g in got]
            s.progress(f"rep {rep + 1}/{cfg.reps}, {label}: engine on core {cores[0]}: "
                       + ", ".join(f"{g['policy']}@{g['seqs']} {g['ratio']:.3f}" for g in got))
    return pairs


def _paired_tables(res: BenchResult, pairs: list[dict], cfg: ThroughputConfig) -> None:
    """The paired figures: per width, each engine policy ÷ each peer as the median of the
    repetitions' ratios (each from one pair, both sides at once), with their range; every pair's
    ratio goes in the result's data."""
    wide = []
    for n in cfg.seqs:
        row: dict[str, Any] = {"seqs": n}
        for peer in dict.fromkeys(p["peer"] for p in pairs):
            for policy in cfg.policies:
                xs = [p["ratio"] for p in pairs if p["seqs"] == n and p["peer"] == peer and p["policy"] == policy]
                if xs:
                    row[f"{policy} ÷ {SHORT.get(peer, peer)}"] = rnd(median(xs), 3)
                    row[f"{policy} ÷ {SHORT.get(peer, peer)} (min-max)"] = f"{min(xs):.3f}-{max(xs):.3f}"
        wide.append(row)
    res.tables[f"both sides at once: engine ÷ peer, median of {cfg.reps} repetitions' ratios"] = wide
    res.data["pairs"] = pairs  # every pair: the engine's median ÷ the peer's over the runs both made at once
    res.notes.append(
        "paired: the engine and one peer generate at the same time, each pinned to a core of its own (one thread "
        "each), the cores swapped every repetition; per width both sides load, warm up and start together, "
        "and each counts its first runs (the engine's policies in turn), all made while the other side ran "
        f"({cfg.pair_runs or 'max(3, 8 / sequences)'} per side and policy); a repetition's ratio is the "
        "engine's median over the peer's. Both sides share the memory bus and caches, so their tok/s are "
        "lower than alone: read the ratios. llama-batched-bench loads the model for every run (its load "
        "is not in its time)")


def _tables(res: BenchResult, runs: list[dict], engine_steps: dict, cfg: ThroughputConfig, info: dict,
            found) -> None:
    base_peer = f"engine {cfg.policies[0]}"
    medians = []
    for peer in dict.fromkeys(r["peer"] for r in runs):  # in the order they ran
        for n in cfg.seqs:
            xs = [r for r in runs if r["peer"] == peer and r["seqs"] == n]
            if not xs:
                continue
            medians.append({"peer": peer, "seqs": n, "tok_s": rnd(median(r["tok_s"] for r in xs), 1),
                            "tg_tok_s": rnd(median(r["tg_tok_s"] for r in xs if r["tg_tok_s"]), 1),
                            "reps": len({r["rep"] for r in xs}), **({"runs": len(xs)} if cfg.paired else {}),
                            "spread": rnd(max(r["tok_s"] for r in xs) - min(r["tok_s"] for r in xs), 1),
                            "others_cores_max": rnd(max(r["others"] for r in xs), 2)})
    # Paired, a ratio of medians over every pairing would mix runs of different minutes: the
    # paired tables (_paired_tables) give each pair's ratio instead.
    for e in (f"engine {p}" for p in (() if cfg.paired else cfg.policies)):  # every peer ÷ each policy
        base = {m["seqs"]: m["tok_s"] for m in medians if m["peer"] == e}
        for m in medians:
            m[f"over_{e.split()[1]}"] = rnd(m["tok_s"] / base[m["seqs"]], 3) if base.get(m["seqs"]) else None
    wide = []
    for n in (() if cfg.paired else cfg.seqs):
        at_n = [m for m in medians if m["seqs"] == n]
        row: dict[str, Any] = {"seqs": n, **{m["peer"]: m["tok_s"] for m in at_n}}
        base_tok_s = next((m["tok_s"] for m in at_n if m["peer"] == base_peer), None)
        for m in at_n:
            if m["peer"] != base_peer:
                name = SHORT.get(m["peer"], m["peer"].removeprefix("engine "))
                row[f"engine ÷ {name}"] = rnd(base_tok_s / m["tok_s"], 3) if base_tok_s and m["tok_s"] else None
        wide.append(row)
    if wide:
        res.tables[f"generated tok/s, end to end (median of {cfg.reps}), and {base_peer} ÷ each peer"] = wide
    res.tables["per peer and batch width (tg_tok_s: decode phase only, where the peer reports it)"] = medians
    prof = []
    for n, s in sorted(engine_steps.items()):
        py = [w - nat for w, nat in zip(s["step_ms"], s["native_ms"])]
        prof.append({"seqs": n, "steps": len(py), "step_ms_p50": rnd(median(s["step_ms"]), 2),
                     "native_decode_ms_p50": rnd(median(s["native_ms"]), 2), "python_ms_p50": rnd(median(py), 3),
                     "python_share": rnd(sum(py) / sum(s["step_ms"]), 3) if s["step_ms"] else None})
    res.tables[f"engine step time: Python vs native llama_decode ({base_peer})"] = prof
    res.data.update({"medians": medians, "runs": runs, "backend": info,
                     "tools": peers.tool_info(found[0]) if found else None,
                     "label": f"{info.get('model_name', info['backend'])} on {info.get('device_name', '')}, "
                              f"{info.get('n_threads', '?')} threads: prompt {cfg.prompt}, {cfg.gen} generated per sequence"})
    res.notes += [
        f"every peer: same GGUF, {info.get('n_threads')} threads, n_batch {info.get('n_batch')}, n_ubatch "
        f"{info.get('n_ubatch')}, unified KV, greedy, {cfg.prompt} prompt tokens and exactly {cfg.gen} generated "
        "per sequence (EOS ignored), distinct prompts",
        "tok/s = sequences x generated tokens / wall time from the first prompt to the last token (prefill included); "
        "llama-batched-bench: its T = T_PP + T_TG",
        OTHERS_NOTE,
        "the engine side runs each repetition in a fresh process on its own load of the model, as every peer "
        "run does (this machine runs one process's native steps at one of two speeds: docs/BENCHMARKS.md, "
        "issue 28); its cost model is calibrated once, at the warm-up",
        "Llama serial = llama-cpp-python's high-level Llama.generate, one request after another",
        f"the engine's --spec: {cfg.spec.value}" + (" (no drafts: the work every peer does)" if cfg.spec is SpecMode.OFF else
                                              " (drafts verified in the batch; no peer speculates)"),
        *([f"+{APP_DEFAULTS}: the engine as the app launches it, --spec auto and (above one thread) the thread "
           "governor choosing 1..threads between steps; without it both are off"]
          if any(p.endswith("+" + APP_DEFAULTS) for p in cfg.policies) else []),
        f"the engine's requests: {cfg.priority.label}" + (
            " (the class serve gives API calls: no person paces the steps, prompts go in large batches)"
            if cfg.priority is not Priority.INTERACTIVE else " (a person's turns: steps paced by the policy's target)"),
    ]
