"""Provides what every benchmark shares: backends, exact-length prompts, stats, result files and tables."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.table import Table

from backend.cpu_load import CpuLoad
from backend.factory import BackendConfig, build_backend

# A plain passage the real tokenizer turns into ordinary text tokens; prompts are cut from it at
# different offsets so that no two sequences share a prefix (nothing is reusable by accident).
PASSAGE = (
    "The harbour town woke slowly. Fishermen checked their nets while the baker stacked warm loaves "
    "by the window, and a group of children raced along the sea wall toward the lighthouse. Old maps "
    "in the library showed the coastline as it had been two hundred years before, when the river still "
    "met the sea north of the cliffs. Travellers came for the markets in spring, for the storms in "
    "autumn, and for the quiet in winter, when the streets belonged to cats and the gulls argued over "
    "the last of the catch. Every evening the keeper climbed the stairs, counted the steps aloud, and "
    "lit the lamp that had guided ships past the reef for as long as anyone could remember. "
)


# ---- backends ------------------------------------------------------------------------------------

class CpuClock:
    """CPU seconds of this process. With one llama.cpp thread every step computes on the calling
    thread, so this measures the work done whatever else a shared machine runs; sleeping sleeps."""

    def __call__(self) -> float:
        return time.process_time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


CPU_CLOCK = CpuClock()


@contextmanager
def loaded(spec: BackendConfig) -> Iterator[Any]:
    """The backend `spec` names, for as long as the block runs (closed after it, whatever happens)."""
    backend = build_backend(spec)
    try:
        yield backend
    finally:
        backend.close()


def cpu_clock_for(backend, asked: bool) -> CpuClock | None:
    """CPU_CLOCK where --cpu-clock asked for it on a backend timed for real; None (the backend's own
    clock) otherwise: a simulated profile's virtual clock already times the work alone."""
    return CPU_CLOCK if asked and backend.known_costs is None else None


class StepTimer:
    """A backend view for benchmarks: it records each native decode's time (llama_decode +
    synchronize) for the profile tables, re-timed on `step_clock` when given. Equal work (every
    request making exactly max_tokens) is the requests' own `ignore_eos`, which `Drive` sets."""

    _PASS = ("tokenize", "tokenize_chat", "detokenizer", "set_sampler", "sample", "free_sampler",
             "kv_remove", "kv_keep_prefix", "kv_copy", "kv_pos_max", "kv_cells_used", "is_eog", "close")

    def __init__(self, backend, step_clock: Callable[[], float] | None = None) -> None:
        """`step_clock` (seconds) re-times each decode with it, e.g. `time.process_time` for the
        CPU time a one-thread step took whatever else the machine ran; None keeps the backend's."""
        self._backend = backend
        self._step_clock = step_clock
        self.decode_ms: list[float] = []
        # Bound once, so the hot path pays no __getattr__ fallback per call.
        for name in self._PASS:
            setattr(self, name, getattr(backend, name))

    def decode(self, plan):
        if self._step_clock is None:
            result = self._backend.decode(plan)
        else:
            t0 = self._step_clock()
            result = self._backend.decode(plan)
            result.step_ms = (self._step_clock() - t0) * 1000.0
        self.decode_ms.append(result.step_ms)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


_PASSAGE_CACHE: dict[int, list[int]] = {}  # PASSAGE's tokens per backend (by id)


def prompt_tokens(backend, n: int, salt: int = 0) -> tuple[int, ...]:
    """Exactly n ordinary text tokens; a different salt gives a different first token."""
    if id(backend) not in _PASSAGE_CACHE:
        try:
            toks = [t for t in backend.tokenize(PASSAGE) if 0 <= t < backend.n_vocab]
        except Exception:
            toks = []
        if len(set(toks)) < 32:  # a backend without a real vocabulary: any in-range ids will do
            toks = [(997 * i + 13) % max(backend.n_vocab - 1, 2) + 1 for i in range(512)]
        _PASSAGE_CACHE[id(backend)] = toks
    base = _PASSAGE_CACHE[id(backend)]
    start = (salt * 7) % len(base)
    reps = (start + n) // len(base) + 1
    return tuple((base * reps)[start:start + n])


def sized(spec: BackendConfig, *, cells: int, seqs: int, floor: int = 8192, **changes: Any) -> BackendConfig:
    """`spec` with room for `cells` KV cells (rounded up to 1,024, at least `floor`) unless it sets
    its own n_ctx (--ctx), and for at least `seqs` sequences."""
    return replace(spec, n_ctx=spec.n_ctx or max(floor, -(-cells // 1024) * 1024),
                   n_seq_max=max(spec.n_seq_max, seqs), **changes)


# ---- a shared machine ----------------------------------------------------------------------------

class Contention:
    """How many cores other processes kept busy while a measurement ran: backend.cpu_load.CpuLoad
    since this was made, leaving out this process, its reaped children and `pids` (our own helpers,
    a server say). It fails at once where /proc/stat cannot be read, rather than record a quiet machine
    it cannot see.

    On a 2-core machine shared with other work, llama.cpp's spinning thread barriers turn one busy
    neighbour into a many-fold slowdown, so every measurement records this and is retried if needed.
    """

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self.pids = pids
        self._load = CpuLoad(exclude_pids=pids, own_children=True)
        if not self._load.readable:
            raise OSError("cannot read /proc/stat: other processes' CPU use is unknown")

    def others_cores(self) -> float:
        return self._load.others(since_start=True) or 0.0


def watched(fn: Callable[[], Any], pids: tuple[int, ...] = ()) -> tuple[Any, float]:
    """fn's result, and the cores other processes than `pids` (our own helpers) kept busy while it ran."""
    seen = Contention(pids)
    return fn(), seen.others_cores()


# How long a benchmark waits for other processes to leave the CPU before measuring anyway
# (MAGNITUDE_BENCH_QUIET_WAIT_S). Bounded: on a machine shared with other work it may never be
# quiet, and a benchmark that waits forever measures nothing; the others_cores column says how
# busy it was.
QUIET_WAIT_S = 60.0

# The note every result measured through `measured` carries about its others_cores column.
OTHERS_NOTE = ("others_cores: cores other processes kept busy during a measurement (a shared machine); one over "
               "0.25 was measured again, up to twice, after waiting for the machine to go quiet")

# Waits that ran out before the machine went quiet, for the result's notes.
NOT_QUIET: list[float] = []


def quiet_wait_s() -> float:
    try:
        return float(os.environ.get("MAGNITUDE_BENCH_QUIET_WAIT_S", QUIET_WAIT_S))
    except ValueError:
        return QUIET_WAIT_S


def wait_for_quiet(max_wait_s: float | None = None, threshold: float = 0.15, quiet_s: int = 3,
                   progress: Callable[[str], None] = lambda s: None) -> bool:
    """Block until other processes use under `threshold` cores for `quiet_s` seconds in a row, or
    until `max_wait_s` (default: quiet_wait_s()) ran out. True if the machine went quiet."""
    limit = quiet_wait_s() if max_wait_s is None else max_wait_s
    t0, quiet, told = time.monotonic(), 0, False
    while quiet < quiet_s and time.monotonic() - t0 < limit:
        c = Contention()
        time.sleep(1.0)
        quiet = quiet + 1 if c.others_cores() < threshold else 0
        if not quiet and not told and time.monotonic() - t0 > 5:
            progress(f"waiting up to {limit:.0f} s for other processes to leave the CPU ...")
            told = True
    if quiet < quiet_s:
        NOT_QUIET.append(limit)
        progress(f"the machine did not go quiet within {limit:.0f} s; measuring anyway")
        return False
    return True


def not_quiet_notes() -> list[str]:
    """The note for results measured without the quiet machine they waited for (none if every wait ended quiet)."""
    return [f"{len(NOT_QUIET)} measurement(s) started on a busy machine after waiting {NOT_QUIET[-1]:.0f} s "
            "for it to go quiet (MAGNITUDE_BENCH_QUIET_WAIT_S); see others_cores"] if NOT_QUIET else []


def measured(fn: Callable[[], Any], *, retries: int = 2, limit: float = 0.25, pids: tuple[int, ...] = (),
             progress: Callable[[str], None] = lambda s: None) -> tuple[Any, float]:
    """Run fn on a quiet machine; if other processes took over `limit` cores meanwhile, wait and
    run it again (up to `retries` times; no more once a wait ran out, since a machine that stays
    busy will not get quieter by retrying). Returns (fn's result, cores others used in the kept run).
    MAGNITUDE_BENCH_WAIT_QUIET=0 turns the waiting and retrying off (smoke tests): it only records."""
    if os.environ.get("MAGNITUDE_BENCH_WAIT_QUIET", "1") == "0":
        return watched(fn, pids)
    for attempt in range(retries + 1):
        went_quiet = wait_for_quiet(progress=progress)
        out, busy = watched(fn, pids)
        if busy <= limit or attempt == retries or not went_quiet:
            return out, busy
        progress(f"other processes used {busy:.2f} cores during the run; measuring again")
    raise AssertionError("unreachable")


# ---- results -------------------------------------------------------------------------------------

def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def git_version() -> str:
    """`git describe` of the code a bench ran ("?" outside a checkout)."""
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine_info() -> dict:
    """What the figures were measured on (the load before and after a run: `harness.recorded`)."""
    info: dict[str, Any] = {"os": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count()}
    with suppress(OSError, StopIteration):
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        if model := next((l for l in cpuinfo if l.startswith("model name")), None):
            info["cpu"] = model.split(":", 1)[1].strip()
        flags = next((l for l in cpuinfo if l.startswith("flags")), "")
        info["simd"] = " ".join(f for f in ("avx2", "avx512f", "fma", "f16c") if f" {f}" in flags)
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        info["memory_gib"] = round(int(mem.split()[1]) / 2**20, 1)
    with suppress(Exception):
        import importlib.metadata as md

        info["llama_cpp_python"] = md.version("llama_cpp_python")
    return info


@dataclass
class BenchResult:
    """One benchmark run: its configuration, the machine, one or more tables and free-form notes."""

    name: str
    title: str
    config: dict
    machine: dict = field(default_factory=machine_info)  # at construction (the load: `harness.recorded`)
    tables: dict[str, list[dict]] = field(default_factory=dict)  # table title -> rows
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)  # raw series for plots and re-analysis
    # Every measured run, not only the medians the tables show (harness.sweep's records).
    repetitions: list[dict] = field(default_factory=list)
    # How this run ran: command line, code version, start, wall time, load before and after
    # (harness.recorded).
    run: dict = field(default_factory=dict)


def backend_info(backend, params=None) -> dict:
    """What a result records of its backend; with `params`, also the cost model and attention path."""
    info = {"backend": backend.name, "n_ctx": backend.n_ctx, "n_batch": backend.n_batch,
            "n_seq_max": backend.n_seq_max, "model_name": backend.model_name, "device_name": backend.device_name,
            "n_threads": backend.n_threads, "n_ubatch": backend.n_ubatch}
    if params is not None:
        info |= {"cost": asdict(params), "attention": backend.info.get("attention")}
    return info


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(rows[0].keys())
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def print_result(result: BenchResult, console: Console | None = None) -> None:
    # Wide tables fold rather than truncate; a narrow terminal still gets every figure.
    console = console or Console(width=max(Console().width, 200))
    for title, rows in result.tables.items():
        table = Table(title=f"{result.title}: {title}", title_justify="left")
        cols = list(rows[0].keys()) if rows else []
        for c in cols:
            table.add_column(c, justify="left" if c in ("policy", "peer", "backend", "mode") else "right")
        for r in rows:
            table.add_row(*(_fmt(r.get(c)) for c in cols))
        console.print(table)
    for note in result.notes:
        console.print(f"[dim]- {note}[/]")


def save_result(result: BenchResult, out_dir: str | os.PathLike = "results",
                plot: Callable[[BenchResult, Path], None] | None = None) -> dict[str, Path]:
    """Write results/<name>-<timestamp>.json, .md and (with a plot function) .png; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # A result that did not come through harness.recorded still says how busy the machine was.
    result.machine.setdefault("load_avg_at_end", load_avg())
    base = out / f"{result.name}-{stamp}"
    paths = {"json": base.with_suffix(".json"), "md": base.with_suffix(".md")}
    paths["json"].write_text(json.dumps(asdict(result), indent=1, default=str))
    md = [f"# {result.title}\n"]
    for title, rows in result.tables.items():
        md += [f"## {title}\n", markdown_table(rows)]
    if result.notes:
        md += ["Notes:\n"] + [f"- {n}" for n in result.notes] + [""]
    md += ["```", json.dumps({"run": result.run, "config": result.config, "machine": result.machine}, indent=1,
                             default=str), "```", ""]
    paths["md"].write_text("\n".join(md))
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        paths["png"] = base.with_suffix(".png")
        plot(result, paths["png"])
    return paths
