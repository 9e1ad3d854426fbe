"""Provides the benches' one harness: an engine (or an engine client) driven over requests on a
clock into a trace, configurations x repetitions swept in alternating order, and the record of how
a run ran."""

from __future__ import annotations

import functools
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence, TypeVar

from backend.factory import reset_kv
from magnitude_bench.common import StepTimer, git_version, load_avg, measured, watched
from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.protocol import seq_updates
from magnitude_tui.engine.waiting import wait_ready
from scheduler.budget import parse_policy
from scheduler.types import Phase, Request

C = TypeVar("C")


@dataclass
class Step:
    """One engine step that reported something (times in ms; `t` on the engine clock, seconds)."""

    t: float  # the engine clock at the step's end: every token it made carries this time
    step_ms: float  # the engine's own timing of decode + sampling
    host_ms: float  # the whole `Engine.step()` call on the bench clock (scheduling included)
    native_ms: float | None  # the backend's decode inside it (StepTimer views); None: no decode
    decode_rows: int
    prefill_rows: int
    tokens: int  # tokens the step committed, every request's
    draft_rows: int
    draft_accepted: int
    yielded_rows: int
    kv_idle: int

    @property
    def rows(self) -> int:
        return self.decode_rows + self.prefill_rows


@dataclass
class Trace:
    """What the engine did for one measurement: per request its submission, token times (engine
    clock), cached tokens, the engine's own queue and TTFT figures, text and end; every step."""

    submitted: dict[str, float] = field(default_factory=dict)  # bench clock at submission
    tokens: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    cached: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    queue_ms: dict[str, float] = field(default_factory=dict)
    ttft_ms: dict[str, float] = field(default_factory=dict)  # as the engine measured it
    texts: dict[str, str] = field(default_factory=lambda: defaultdict(str))
    done: dict[str, float] = field(default_factory=dict)  # engine clock of the step that ended it
    prompt_total: dict[str, int] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)  # each request's last update (its SeqUpdate)
    steps: list[Step] = field(default_factory=list)
    ended: float | None = None  # bench clock when `Drive.run` returned

    @property
    def busy_steps(self) -> list[Step]:
        """The steps that ran rows (a report can also carry only state changes)."""
        return [s for s in self.steps if s.rows]

    def ttft(self, rid: str) -> float:
        """Seconds from the submission to the first token, on the bench clock."""
        return self.tokens[rid][0] - self.submitted[rid]

    def itl_ms(self, rid: str) -> list[float]:
        ts = self.tokens.get(rid, [])
        return [(b - a) * 1000.0 for a, b in zip(ts, ts[1:])]

    @property
    def wall_s(self) -> float:
        """Seconds from the submission to the end of the run (a finished trace)."""
        assert self.ended is not None, "the trace has not ended"
        return self.ended - min(self.submitted.values())

    def made(self) -> int:
        return sum(len(ts) for ts in self.tokens.values())

    def generated(self) -> int:
        """Tokens made, as the requests' final updates count them (a client's trace)."""
        return sum(u.generated for u in self.final.values())

    def decode_tok_s(self, made: int, requests: int) -> float | None:
        """Tokens a second from the step where all `requests` have their first token (the batch only
        decodes from there) to the end; None where no token came after it."""
        t_all_first = max((ts[0] for ts in self.tokens.values() if ts), default=None)
        if t_all_first is None or self.ended is None or len(self.tokens) != requests:
            return None
        made_at_first = sum(1 for ts in self.tokens.values() for t in ts if t <= t_all_first)
        decode_s = self.ended - t_all_first
        return (made - made_at_first) / decode_s if decode_s > 0 and made > made_at_first else None


class Drive:
    """One engine on a backend, driven step by step on the bench clock, every step booked into
    `trace`. Its view of the backend is a `StepTimer`. With `fixed_length` every request submitted
    makes exactly its max_tokens (`ignore_eos`: equal work whatever the model would say)."""

    def __init__(self, backend, *, policy: str = "target:50", gen_reserve: int = 256, clock=None,
                 params=None, calibrate: bool | None = None, fixed_length: bool = True,
                 coalesce_ms: float = 0.0, what: str = "", **engine_kw: Any) -> None:
        """`clock`: the bench clock (e.g. CPU_CLOCK; None: the backend's). `params`: a cost model
        to seed (calibrated once for many engines); else `calibrate` (None: when the policy has a
        step target). Submitted between two steps, a burst is taken in by one step: no coalescing."""
        reset_kv(backend)
        self.backend = backend
        self.view = StepTimer(backend, clock)
        self.fixed_length = fixed_length
        self.engine = Engine(self.view, policy=policy, coalesce_ms=coalesce_ms, gen_reserve=gen_reserve,
                             clock=clock, **engine_kw)
        self.clock = clock or backend.clock
        self.what = what or policy
        if params is not None:
            self.engine.scheduler.cost.seed(params)
        elif calibrate or (calibrate is None and parse_policy(policy).target_ms is not None):
            params = self.engine.calibrate()
        self.params = params
        self.trace = Trace()
        self._sessions: dict[str, None] = {}
        self._live: dict[str, None] = {}

    def submit(self, *reqs: Request) -> float:
        """Queue requests together; returns the bench clock at their submission."""
        t0 = self.clock()
        for r in reqs:
            if self.fixed_length and not r.sampling.ignore_eos:
                r = replace(r, sampling=replace(r.sampling, ignore_eos=True))
            self.trace.submitted[r.request_id] = t0
            self._sessions[r.session_id] = None
            self._live[r.request_id] = None
            self.engine.submit(r)
        return t0

    def step(self):
        """One engine step, booked (its StepReport, or None); a failed request stops the measurement."""
        decoded = len(self.view.decode_ms)
        ts = self.clock()
        report = self.engine.step()
        host_ms = (self.clock() - ts) * 1000.0
        if report is None:
            return None
        tr, made = self.trace, 0
        for u in report.updates:
            if u.error:
                raise RuntimeError(f"{self.what}: request {u.request_id} failed: {u.error}")
            rid = u.request_id
            tr.tokens[rid].extend([report.t] * u.new_tokens)
            made += u.new_tokens
            tr.cached[rid] = max(tr.cached[rid], u.cached_tokens)
            tr.texts[rid] += u.text_delta
            tr.prompt_total[rid] = u.prompt_total
            if u.queue_ms is not None:
                tr.queue_ms[rid] = u.queue_ms
            if u.ttft_ms is not None:
                tr.ttft_ms[rid] = u.ttft_ms
            if u.done_reason is not None:
                tr.done[rid] = report.t
                tr.final[rid] = u
                self._live.pop(rid, None)
        native = self.view.decode_ms[-1] if len(self.view.decode_ms) > decoded else None
        tr.steps.append(Step(report.t, report.step_ms, host_ms, native, report.decode_rows, report.prefill_rows,
                             made, report.draft_rows, report.draft_accepted, report.yielded_rows, report.kv_idle))
        return report

    def until(self, done: Callable[[], bool], max_idle: int = 1000) -> None:
        """Step until `done()`; an engine that goes idle first is an error, not a wait."""
        idle = 0
        while not done():
            report = self.step()
            if report is None:
                idle += 1
                if not self.engine.has_work() or idle > max_idle:
                    raise RuntimeError(f"{self.what}: the engine went idle before the scenario finished")
            if report is None or not (report.decode_rows + report.prefill_rows):
                wait = self.engine.wait_hint()  # a coalescing window, where the engine has one
                if wait:
                    self.clock.sleep(wait)

    def run_out(self) -> None:
        self.until(lambda: not self.engine.has_work())

    def run(self, reqs: Sequence[Request]) -> Trace:
        """A fresh trace: every request submitted at once and run to the end."""
        self.trace = Trace()
        self.submit(*reqs)
        self.run_out()
        self.trace.ended = self.clock()
        return self.trace

    def close(self, check: bool = True) -> None:
        """Cancel what still runs, close every session it submitted, and leave the KV cache empty;
        `check`: the engine must hold nothing afterwards (a leak fails the measurement)."""
        for rid in self._live:
            self.engine.cancel(rid)
        self.engine.run_until_idle()
        for sid in self._sessions:
            self.engine.close_session(sid)
        self.engine.run_until_idle()
        if check and not self.engine.is_empty():
            raise RuntimeError(f"{self.what}: the engine kept state after the run: {self.engine.leaks()}")
        reset_kv(self.backend)


@contextmanager
def started(client, timeout_s: float) -> Iterator[Any]:
    """A started EngineClient's EngineReady, once it is ready, for as long as the block runs
    (stopped after it, whatever happens)."""
    client.start()
    try:
        yield wait_ready(client, timeout_s)
    finally:
        client.stop()


class ClientRun:
    """Requests on a started EngineClient (the app's worker, a remote server), timed on the wall
    clock as the client sees it: per request its token times (when the client learnt of them),
    text and final update. A failed request raises. `seen`: every event read meanwhile is
    appended to it (step reports, thread counts)."""

    def __init__(self, client, what: str = "", seen: list | None = None) -> None:
        self.client, self.what, self.seen = client, what, seen
        self.trace = Trace()

    def submit(self, *reqs: Request) -> None:
        t0 = time.perf_counter()
        for r in reqs:
            self.trace.submitted[r.request_id] = t0
            self.client.submit(r)

    def until(self, done: Callable[[], bool], timeout_s: float) -> None:
        """Read events until `done()`; not done within `timeout_s`, it raises."""
        tr = self.trace
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.what}{len(tr.submitted) - len(tr.final)} of {len(tr.submitted)} "
                                   f"requests did not finish within {timeout_s:g} s")
            events = self.client.poll_events(0.5) or []
            now = time.perf_counter()
            if self.seen is not None:
                self.seen += events
            for u in seq_updates(events):
                rid = u.request_id
                if rid not in tr.submitted:
                    continue
                tr.texts[rid] += u.text_delta
                tr.tokens[rid].extend([now] * (u.generated - len(tr.tokens[rid])))
                if u.phase is Phase.DONE:
                    if u.error:
                        raise RuntimeError(f"{self.what}request {rid} failed: {u.error}")
                    tr.final[rid], tr.done[rid] = u, now


def client_run(client, reqs: Sequence[Request], timeout_s: float, what: str = "", seen: list | None = None) -> Trace:
    """Every request at once on a started client (`ClientRun`), run until each is done (within `timeout_s`)."""
    run = ClientRun(client, what, seen)
    run.submit(*reqs)
    run.until(lambda: len(run.trace.final) >= len(reqs), timeout_s)
    run.trace.ended = time.perf_counter()
    return run.trace


def calibrated(backend, clock=None):
    """The engine's cost model fitted on this backend (a profile's is read, not timed), to seed
    every engine of a run alike; the KV cache is left empty."""
    reset_kv(backend)
    try:
        return Engine(StepTimer(backend, clock)).calibrate()
    finally:
        reset_kv(backend)


# ---- sweeps --------------------------------------------------------------------------------------

def in_turn(configs: Sequence[C], rep: int) -> Sequence[C]:
    """The order configurations run in at repetition `rep`: every other one reversed (what runs
    first must not decide a ratio)."""
    return configs if rep % 2 == 0 else configs[::-1]


def alternating(configs: Sequence[C], reps: int) -> list[tuple[int, C]]:
    """(repetition, configuration) in the order they run: repetitions outermost, every
    configuration in each (ABAB, not AABB: a neighbour's burst hits all of them alike), `in_turn`."""
    return [(rep, c) for rep in range(reps) for c in in_turn(configs, rep)]


def sweep(configs: Sequence[C], reps: int, run: Callable[[C, int], dict], *, label: Callable[[C], str] = str,
          quiet: bool = True, pids: tuple[int, ...] = (), retries: int = 2,
          progress: Callable[[str], None] = lambda s: None) -> list[dict]:
    """Every configuration `reps` times in alternating order, each run on a quiet machine unless
    `quiet` is off (a simulated clock; a bench that never waited); one record per run, every
    repetition kept: {"config", "rep", **run(config, rep), "others_cores"}."""
    records = []
    for rep, c in alternating(configs, reps):
        if quiet:
            out, busy = measured(lambda: run(c, rep), retries=retries, pids=pids, progress=progress)
        else:
            out, busy = watched(lambda: run(c, rep), pids)
        records.append({"config": label(c), "rep": rep, **out, "others_cores": round(busy, 2)})
    return records


# ---- what a run records about itself -------------------------------------------------------------

def recorded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A bench's entry point: its result records the command line (`argv=` overrides sys.argv),
    the code version, when it ran and the machine's load before the run and after it (the machine
    itself: `machine_info`)."""

    @functools.wraps(fn)
    def run(*args: Any, argv: Sequence[str] | None = None, **kwargs: Any):
        before = {"command": " ".join(sys.argv if argv is None else argv), "git": git_version(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg_before": load_avg()}
        t0 = time.monotonic()
        result = fn(*args, **kwargs)
        result.run = before | {"wall_s": round(time.monotonic() - t0, 1), "load_avg_after": load_avg()}
        result.machine["load_avg_1_5_15"] = before["load_avg_before"]
        result.machine["load_avg_at_end"] = result.run["load_avg_after"]
        return result

    return run
