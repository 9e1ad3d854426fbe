"""Provides the attention-path choice: flash attention on or off, measured per model, device and build."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from backend.cpu_load import CpuLoad, own_cores
from backend.protocol import KvStateError
from scheduler.types import AttentionPath, BatchPlan, DecodeOutcome, SeqSlice

# The probe: PROBE_WIDTH sequences decode near position 0 and again over a shared PROBE_DEPTH-token
# prefix, and that prefix is filled in PROBE_CHUNK-row prompt steps. On 2 CPU cores and
# SmolLM2-135M this takes a few seconds per path; the verdict is cached, so only a model, device,
# thread count or llama.cpp build seen for the first time pays it.
PROBE_DEPTH = 1024
PROBE_WIDTH = 8
PROBE_CHUNK = 256
PROBE_REPEATS = 3
# Other conversations resident while a prompt is evaluated and its neighbours decode: agents keep
# long histories, and the dense path multiplies every row by every resident cell, so a pool of
# them costs it what it does not cost flash. The pool is made of copies of the filled prefix loaded
# as distinct cells (a state load, milliseconds, no compute), where the context holds them beside
# the deep one (`pool_size`). On one CPU thread (Xeon, SmolLM2-135M, 2026-12-06) a probe
# without it chose dense by 1.34x; beside six 1,024-token conversations a 64-row prompt chunk
# took 1,289 ms on flash and 2,541 dense, and the no-bursts agent trace with whole tool results
# (`bench agents`, one repetition each, not kept) took 1.29x llama-server's makespan on the dense
# path (209.1 s against 162.4) and 1.02x on flash in the next run (181.5 s against 177.2).
PROBE_POOL = 6
# Rows of the pool's prompt chunk: one flash tile, the least a paced prompt step takes there.
POOL_CHUNK = 64
# The verdict weighs the paths on one reference workload: fill a PROBE_DEPTH-token prompt, then
# this many decode steps of PROBE_WIDTH sequences near position 0, as many at depth over a shared
# prefix (forks), and as many with one sequence at depth beside short ones (distinct conversations).
REFERENCE_STEPS = 32
# The probe's version, part of the cache key: a verdict measured without the mixed step is measured
# again (it favoured the dense path on workloads where most of its work is masked, issue 28); one
# cached before a busy probe stopped being kept (BUSY_CORES) may have been measured under load (a
# 2-thread verdict here, flash off, was: 316-683 ms steps where quiet ones take about 40), so
# version 3 measures every verdict again and records the load it was measured under; version 4 adds
# the pool of other conversations (a verdict without it chose dense where agents' pools made dense
# twice as slow per prompt row).
PROBE_VERSION = 4

# Dense attention is chosen only when it finishes the reference workload faster by more than this
# factor. Its step multiplies every row by every resident cell, other conversations' included, and
# the probe holds 8 short sequences: with more distinct conversations resident, dense pays for all
# of them and flash does not. On one thread here a probe found dense 1.02x faster, and at 16
# sequences the engine then ran 0.81x llama-server (issue 28, docs/BENCHMARKS.md).
DENSE_MARGIN = 1.05

# ggml type ids (ggml.h) of the V-cache types a user may ask for. A quantized V cache is only
# implemented inside llama.cpp's flash-attention kernels: without them the context fails to start.
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
UNQUANTIZED = ("f32", "f16", "bf16")


# What a user may ask for: "auto" (measure, or read the cached measurement), "on" or "off".
FLASH_ATTN_CHOICES = ("auto", "on", "off")


def check_flash_attn(value: str) -> str:
    v = value.strip().lower()
    if v not in FLASH_ATTN_CHOICES:
        raise ValueError(f"unknown flash-attention setting {value!r}: use auto, on or off")
    return v


def check_cache_type(value: str) -> str:
    v = value.strip().lower()
    if v not in CACHE_TYPES:
        raise ValueError(f"unknown KV cache type {value!r}: use one of {', '.join(CACHE_TYPES)}")
    return v


@dataclass(frozen=True)
class PathTiming:
    """One attention path measured by the probe (milliseconds, medians of PROBE_REPEATS)."""

    flash: bool
    fill_ms: float  # the PROBE_DEPTH-token prompt, in PROBE_CHUNK-row steps
    decode_shallow_ms: float  # PROBE_WIDTH decode rows a few positions deep
    decode_deep_ms: float  # PROBE_WIDTH decode rows over the shared PROBE_DEPTH-token prefix
    chunk_deep_ms: float  # 16 prompt rows at depth PROBE_DEPTH
    # PROBE_WIDTH decode rows, one over its own PROBE_DEPTH-token prefix, the others a few positions
    # deep. In one unified KV pool the dense path multiplies every row by every cell and masks the
    # other sequences' cells afterwards; the flash kernel skips masked cells. Over a shared prefix
    # nothing is masked, so only this step shows what distinct conversations cost each path.
    decode_mixed_ms: float = 0.0
    # With `pool` other conversations of PROBE_DEPTH tokens resident (distinct cells): a POOL_CHUNK-row
    # prompt chunk of the deep one, and a decode step of one row each, the deep one's included.
    chunk_pool_ms: float = 0.0
    decode_pool_ms: float = 0.0
    pool: int = 0

    @property
    def reference_ms(self) -> float:
        """The reference workload: fill a PROBE_DEPTH-token prompt, REFERENCE_STEPS decode steps of
        each kind, and, where a pool was measured, another PROBE_DEPTH prompt rows and
        REFERENCE_STEPS decode steps with the pool resident."""
        return self.weighed(bool(self.pool))

    def weighed(self, pool: bool) -> float:
        """The reference workload with or without its pool part (`reference_ms`)."""
        base = self.fill_ms + REFERENCE_STEPS * (self.decode_shallow_ms + self.decode_deep_ms
                                                 + self.decode_mixed_ms)
        if not pool:
            return base
        return base + (PROBE_DEPTH / POOL_CHUNK) * self.chunk_pool_ms + REFERENCE_STEPS * self.decode_pool_ms


def references(a: PathTiming, b: PathTiming) -> tuple[float, float]:
    """Both paths' reference workloads, weighed alike: with the pool only where both measured the
    same one (a backend that refused the copies on one path is compared without it)."""
    pool = a.pool == b.pool and a.pool > 0
    return a.weighed(pool), b.weighed(pool)


@dataclass(frozen=True)
class AttentionChoice:
    """Which path the context runs, why, and the measurements behind it (if any)."""

    flash: bool
    reason: str
    timings: tuple[PathTiming, ...] = ()
    cached: bool = False
    key: dict = field(default_factory=dict)
    others_cores: float | None = None  # what other processes kept busy while it was measured

    @property
    def path(self) -> AttentionPath:
        return AttentionPath.FLASH if self.flash else AttentionPath.DENSE

    def summary(self) -> str:
        """One line for the logs and `devices --attention`: what and why."""
        return f"flash attention {'on' if self.flash else 'off'}: {self.reason}"

    def short(self) -> str:
        """A few words for the scheduler panel."""
        state = f"flash {'on' if self.flash else 'off'}"
        if len(self.timings) == 2:
            on, off = sorted(self.timings, key=lambda t: not t.flash)
            best, other = (on, off) if self.flash else (off, on)
            best_ms, other_ms = references(best, other)
            return f"{state} · measured {other_ms / best_ms:.2f}x"
        return f"{state} · {self.reason}"

    def deep_samples(self) -> list[tuple[int, int, float, int, int]]:
        """The chosen path's steps at depth, for the cost model's calibration:
        (decode_rows, prefill_rows, step_ms, position of the first row, cells resident before)."""
        mine = next((t for t in self.timings if t.flash == self.flash), None)
        if mine is None:
            return []
        return [(PROBE_WIDTH, 0, mine.decode_deep_ms, PROBE_DEPTH, PROBE_DEPTH),
                (0, 16, mine.chunk_deep_ms, PROBE_DEPTH, PROBE_DEPTH)]


def forced_choice(flash_attn: str, cache_type_v: str) -> AttentionChoice | None:
    """The choice when nothing needs measuring: asked for explicitly, or forced by the V cache."""
    if cache_type_v not in UNQUANTIZED:
        if flash_attn == "off":
            raise ValueError(f"a quantized V cache ({cache_type_v}) needs flash attention: use "
                             "--flash-attn on or auto, or an f16 V cache")
        return AttentionChoice(True, f"a quantized V cache ({cache_type_v}) needs it")
    if flash_attn in ("on", "off"):
        return AttentionChoice(flash_attn == "on", f"asked for (--flash-attn {flash_attn})")
    return None


def decide(timings: tuple[PathTiming, ...], key: dict) -> AttentionChoice:
    """Pick the path that finishes the reference workload sooner; say by how much. Dense must win
    by more than DENSE_MARGIN: within it, flash (see DENSE_MARGIN)."""
    on = next(t for t in timings if t.flash)
    off = next(t for t in timings if not t.flash)
    on_ms, off_ms = references(on, off)
    dense = on_ms > off_ms * DENSE_MARGIN
    best, other = (off, on) if dense else (on, off)
    best_ms, other_ms = (off_ms, on_ms) if dense else (on_ms, off_ms)
    pool = (f", {best.chunk_pool_ms:.0f} vs {other.chunk_pool_ms:.0f} ms for a {POOL_CHUNK}-row prompt chunk "
            f"beside {best.pool} other conversations" if best.pool == other.pool > 0 else "")
    reason = (f"measured {best.decode_deep_ms:.0f} vs {other.decode_deep_ms:.0f} ms for a "
              f"{PROBE_WIDTH}-sequence decode step {PROBE_DEPTH} deep, {best.decode_mixed_ms:.0f} vs "
              f"{other.decode_mixed_ms:.0f} ms with one of them that deep, {best.fill_ms / 1000:.1f} vs "
              f"{other.fill_ms / 1000:.1f} s to fill it{pool} ({other_ms / best_ms:.2f}x "
              f"on the reference workload)")
    if not dense and on_ms > off_ms:
        reason += (f"; dense was faster by less than {DENSE_MARGIN - 1:.0%}, and its cost grows with "
                   "every other conversation's cells")
    return AttentionChoice(best.flash, reason, timings, key=key)


# ---- the probe ---------------------------------------------------------------------------------

def pool_size(n_ctx: int) -> int:
    """Other conversations the probe keeps resident for a context of n_ctx cells: PROBE_POOL where
    the context holds them beside the deep one and its chunks, none where it does not (a small
    context never holds a deep pool). Two sizes only, so that the contexts a machine runs share
    few verdicts, each measured once."""
    return PROBE_POOL if n_ctx >= probe_cells(PROBE_POOL) else 0


def probe_cells(pool: int) -> int:
    """The probe context's cells: the deep conversation, its chunks, and the pool."""
    return (pool + 2) * PROBE_DEPTH


def median(times: list[float]) -> float:
    """The probe's median of PROBE_REPEATS timings (the upper one of an even count)."""
    return sorted(times)[len(times) // 2]


def measure_path(backend, flash: bool, tokens: list[int], pool: int = 0) -> PathTiming:
    """Time one context (a LlamaBackend built with this flash setting) and clear its KV. `pool`
    other conversations (at most n_seq_max - 1, in a context of `probe_cells(pool)`) are loaded for
    the pool steps.

    With one thread every step computes on this thread, so its CPU time is the step's work
    whatever else the machine runs (a verdict is cached, so a busy neighbour must not decide
    it); with more, ggml's helper threads spin while they wait, and wall time is all there is."""
    width = min(PROBE_WIDTH, backend.n_seq_max)
    filler = (tokens * (1 + PROBE_DEPTH // max(1, len(tokens))))[:PROBE_DEPTH + 16]
    one_thread = backend.n_threads == 1 and backend.device_name == "CPU"

    def step(slices: list[SeqSlice]) -> float:
        t0 = time.process_time()
        result = backend.decode(BatchPlan(0, tuple(slices), sum(len(s.tokens) for s in slices)))
        if result.outcome is not DecodeOutcome.OK:
            raise RuntimeError(f"the attention probe's step failed ({result.outcome.value})")
        return (time.process_time() - t0) * 1000.0 if one_thread else result.step_ms

    def decode_all() -> float:
        return step([SeqSlice(s, backend.kv_pos_max(s) + 1, (filler[0],), True, True) for s in range(width)])

    try:
        for s in range(width):
            step([SeqSlice(s, 0, tuple(filler[:4]), True, False)])
        shallow = median([decode_all() for _ in range(PROBE_REPEATS)])
        for s in range(width):
            backend.kv_remove(s)
        fill = 0.0
        for pos in range(0, PROBE_DEPTH, PROBE_CHUNK):
            n = min(PROBE_CHUNK, PROBE_DEPTH - pos)
            fill += step([SeqSlice(0, pos, tuple(filler[pos:pos + n]), n == PROBE_DEPTH - pos, False)])
        chunks = []
        for _ in range(PROBE_REPEATS):
            chunks.append(step([SeqSlice(0, PROBE_DEPTH, tuple(filler[PROBE_DEPTH:PROBE_DEPTH + 16]),
                                         True, False)]))
            backend.kv_keep_prefix(0, PROBE_DEPTH)
        chunk_pool, decode_pool, pool = _pool_steps(backend, step, filler, pool)
        for s in range(1, width):  # short conversations of their own beside the deep one
            step([SeqSlice(s, 0, tuple(filler[s:s + 4]), True, False)])
        mixed = []
        for _ in range(PROBE_REPEATS):
            mixed.append(decode_all())
            for s in range(width):
                backend.kv_keep_prefix(s, PROBE_DEPTH if s == 0 else 4)
        for s in range(1, width):
            backend.kv_copy(0, s, PROBE_DEPTH)
        deep = []
        for _ in range(PROBE_REPEATS):
            deep.append(decode_all())
            for s in range(width):
                backend.kv_keep_prefix(s, PROBE_DEPTH)
        return PathTiming(flash, fill, shallow, median(deep), median(chunks), median(mixed),
                          chunk_pool, decode_pool, pool)
    finally:
        for s in range(min(max(width, pool + 1), backend.n_seq_max)):
            backend.kv_remove(s)


def _pool_steps(backend, step, filler: list[int], pool: int) -> tuple[float, float, int]:
    """With seq 0 holding PROBE_DEPTH tokens: load copies of it as `pool` other conversations
    (seqs 1..pool, distinct cells), time a POOL_CHUNK-row chunk of seq 0 and a decode step of one
    row per conversation, and remove the copies. (0, 0, 0) when there is no pool, or the backend
    refuses the copies (a sliding-window model may): then neither path is weighed on one."""
    pool = min(pool, backend.n_seq_max - 1)
    if pool <= 0:
        return 0.0, 0.0, 0
    try:
        state = backend.kv_save(0)
        for s in range(1, pool + 1):
            backend.kv_load(s, state)
    except KvStateError:
        for s in range(1, pool + 1):
            backend.kv_remove(s)
        return 0.0, 0.0, 0
    del state
    chunks, decodes = [], []
    for _ in range(PROBE_REPEATS):
        chunks.append(step([SeqSlice(0, PROBE_DEPTH, tuple(filler[PROBE_DEPTH - POOL_CHUNK:PROBE_DEPTH]),
                                     True, False)]))
        backend.kv_keep_prefix(0, PROBE_DEPTH)
    for _ in range(PROBE_REPEATS):
        decodes.append(step([SeqSlice(s, PROBE_DEPTH, (filler[0],), True, True) for s in range(pool + 1)]))
        for s in range(pool + 1):
            backend.kv_keep_prefix(s, PROBE_DEPTH)
    for s in range(1, pool + 1):
        backend.kv_remove(s)
    return median(chunks), median(decodes), pool


# ---- the cache ---------------------------------------------------------------------------------

def cache_dir() -> Path:
    env = os.environ.get("MAGNITUDE_ATTENTION_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "magnitude-tui" / "attention"


def cache_key(*, model_path: str, device: str, n_threads: int, n_ubatch: int, build: str, pool: int = 0) -> dict:
    st = os.stat(model_path)
    return {"model": os.path.abspath(model_path), "model_size": st.st_size, "model_mtime": int(st.st_mtime),
            "device": device, "n_threads": n_threads, "n_ubatch": n_ubatch, "build": build,
            "probe": [PROBE_DEPTH, PROBE_WIDTH, PROBE_CHUNK, pool, PROBE_VERSION]}


def _cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"{digest}.json"


def load_cached(key: dict) -> AttentionChoice | None:
    try:
        data = json.loads(_cache_file(key).read_text())
        if data.get("key") != key:
            return None
        timings = tuple(PathTiming(**t) for t in data["timings"])
        if sorted(t.flash for t in timings) != [False, True]:
            return None  # not a verdict this probe wrote: measure again
        # Decided again from the cached timings, so a change of the rule needs no new measurement.
        return replace(decide(timings, key), cached=True, others_cores=data.get("others_cores"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(choice: AttentionChoice) -> None:
    """Keep the verdict for the next start; a read-only cache only costs the next start a probe."""
    try:
        path = _cache_file(choice.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": choice.key, "flash": choice.flash, "reason": choice.reason,
                                    "others_cores": choice.others_cores,
                                    "timings": [asdict(t) for t in choice.timings]}, indent=1))
    except OSError:
        pass


# A probe during which other processes kept more cores than this busy decides this start only: its
# verdict is not cached (on 2 threads, a probe on a loaded machine timed 8-row steps at 316-683 ms
# where quiet ones take about 40, and picked the path the quiet machine would not have).
BUSY_CORES = 0.25


def others_meter() -> Callable[[], float]:
    """Start counting the CPU other processes use; the returned function says how many cores they
    kept busy on average since (0.0 where /proc cannot be read). This process and its parent (the
    app that started an engine worker, drawing its loading screen) are not "others". Where this
    process may run on only some of the machine's cores (taskset, a cpuset), only those count:
    a busy neighbour on another core does not make the probe's timings a loaded machine's."""
    load = CpuLoad(cores=own_cores(), exclude_parent=True, own_children=True)
    return lambda: load.others(since_start=True) or 0.0


def choose(*, key: dict, measure: Callable[[bool], PathTiming],
           meter: Callable[[], Callable[[], float]] = others_meter) -> AttentionChoice:
    """The cached verdict for `key`, else measure both paths (`measure(flash)`) and cache it, unless
    other processes kept more than BUSY_CORES busy meanwhile: then the verdict serves this start
    only and the next start measures again."""
    cached = load_cached(key)
    if cached is not None:
        return cached
    others = meter()
    timings: dict[bool, PathTiming] = {}
    for flash in (True, False):
        try:
            timings[flash] = measure(flash)
        except Exception as e:  # a path this device cannot run is not a reason to fail the load
            other = not flash
            return AttentionChoice(other, f"flash attention {'on' if flash else 'off'} failed in the "
                                   f"probe ({e})", key=key)
    busy = others()
    choice = replace(decide((timings[True], timings[False]), key), others_cores=round(busy, 3))
    if busy > BUSY_CORES:
        return replace(choice, reason=f"{choice.reason}; not kept: other processes kept {busy:.1f} cores "
                                      "busy during the probe, so the next start measures again")
    store(choice)
    return choice
