"""bench ui-cpu: what the app itself costs while N panes stream, without running a model.

The real MagnitudeApp runs headless (``App.run_test``) against `PacedClient`, a stand-in EngineClient
whose thread emits one StepReport per engine step at a fixed rate (25 Hz by default, like the real
engine here), giving every live request one token of a Markdown reply a step. Nothing else competes
for the CPU, so the figures repeat on a small shared machine: ``app_cores``, the app process's CPU
seconds per wall second while the panes stream, less the stand-in thread's own; and keypress-to-screen
latency, timed as `bench ui` times it (every frame rendered to terminal bytes as a real driver would).
"""

from __future__ import annotations

import asyncio
import queue
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from magnitude_bench.ui_keys import FrameProbe, KeyFigures, open_panes, run_on_stand_in, type_and_time_key

if TYPE_CHECKING:
    from scheduler.budget import Policy
    from scheduler.speculation import SpecMode

REPLY = """Here is how I would approach it, step by step.

First, measure before changing anything: a profile tells you where the time goes, and guesses \
are usually wrong. Keep the workload fixed so two runs can be compared.

1. Take a **baseline** with the same inputs.
2. Change *one* thing at a time.
3. Measure again, and keep the change only if it helps.

A small example in Python:

```python
import time

def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start
```

Then look at the numbers side by side. If the difference is smaller than the noise between two \
identical runs, it is not a difference. Repeat the runs, alternate them, and report the median \
rather than the best case.

Finally, write down what you measured and how, so that someone else can run it again later."""


def reply_tokens(text: str = REPLY) -> list[str]:
    """The reply cut into token-sized pieces (words with their spaces; newlines on their own)."""
    return [t for t in re.findall(r"\n|[^\s]+ ?| +", text) if t]


@dataclass
class _Live:
    request_id: str
    session_id: str
    seq_id: int
    sent: int = 0
    steps: int = 0
    cancelled: bool = False


class PacedClient:
    """The EngineClient API; a thread emits one step batch every 1/step_hz seconds.

    Each step gives every generating request one token. Replies are `reply_tokens` long (the
    reply text is repeated as needed). `thread_cpu_s` is the CPU time the stepping thread used.
    """

    def __init__(self, *, step_hz: float = 25.0, tokens: int = 400, policy: str = "target:50") -> None:
        self.step_hz = step_hz
        self.tokens = tokens
        self.policy = policy
        self.words = reply_tokens()
        self.submitted = 0
        self.steps = 0
        self.emitted = 0  # tokens handed out, all requests together
        self.thread_cpu_s = 0.0
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._alive = False

    # ---- EngineClient API ---------------------------------------------------------------------

    @property
    def target(self):
        from magnitude_tui.engine.protocol import EngineTarget

        return EngineTarget("paced.gguf", "CPU")

    @property
    def pid(self) -> int | None:
        return None

    @property
    def alive(self) -> bool:
        return self._alive

    def start(self) -> None:
        from magnitude_tui.engine.events import EngineReady, LoadProgress

        self._alive = True
        self._queue.put([LoadProgress(1.0, "paced.gguf", "CPU"),
                         EngineReady("paced.gguf", "CPU", 8192, 16, 2048, self.policy)])
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="paced-engine", daemon=True)
        self._thread.start()

    def restart(self) -> None:
        self.stop()
        self.start()

    def stop(self) -> None:
        self._alive = False
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        self._thread = None

    def submit(self, request) -> None:
        with self._lock:
            used = {l.seq_id for l in self._live.values()}
            seq_id = min(set(range(64)) - used)
            self._live[request.request_id] = _Live(request.request_id, request.session_id, seq_id)
            self.submitted += 1

    def cancel(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._live:
                self._live[request_id].cancelled = True

    def close_session(self, session_id: str) -> None:
        pass

    def restore_session(self, session_id: str, messages: tuple) -> None:
        pass  # a paced stand-in holds no KV: nothing to restore, nothing to answer

    def forget(self, session_id: str) -> None:
        pass

    def set_policy(self, policy: str | Policy) -> None:
        from magnitude_tui.engine.events import PolicyChanged

        self.policy = str(policy)
        self._queue.put([PolicyChanged(self.policy)])

    def set_spec(self, mode: str | SpecMode) -> None:
        from magnitude_tui.engine.events import SpecChanged

        self._queue.put([SpecChanged(str(getattr(mode, "value", mode)))])

    def poll_events(self, timeout: float | None = 0.0) -> list | None:
        try:
            return self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            return None

    # ---- the stepping thread ------------------------------------------------------------------

    def _run(self) -> None:
        cpu0 = time.thread_time()
        period = 1.0 / self.step_hz
        t0 = next_t = time.perf_counter()
        try:
            while not self._stop.is_set():
                next_t += period
                delay = next_t - time.perf_counter()
                if delay > 0:
                    self._stop.wait(delay)
                else:
                    next_t = time.perf_counter()  # fell behind: do not burst to catch up
                self._queue.put([self._step(time.perf_counter() - t0)])
                self.thread_cpu_s = time.thread_time() - cpu0
        finally:
            self.thread_cpu_s = time.thread_time() - cpu0

    def _step(self, t: float):
        from magnitude_tui.engine.events import SeqUpdate, StepReport
        from scheduler.types import DoneReason, Phase

        self.steps += 1
        updates, decode, prefill = [], 0, 0
        jitter = (self.steps % 7) * 0.6
        with self._lock:
            for rid, l in list(self._live.items()):
                l.steps += 1
                u = SeqUpdate(rid, l.session_id, l.seq_id, Phase.QUEUED, prompt_total=64, queue_ms=14.0)
                if l.cancelled:
                    u.phase, u.done_reason = Phase.DONE, DoneReason.CANCELLED
                elif l.steps == 1:
                    u.phase, u.prompt_done, u.cached_tokens = Phase.PREFILL, 32, 8
                    prefill += 32
                else:
                    u.phase, u.prompt_done, u.cached_tokens = Phase.GENERATING, 64, 8
                    if l.steps == 2:
                        prefill += 32
                    u.text_delta = self.words[l.sent % len(self.words)]
                    u.new_tokens = 1
                    l.sent += 1
                    self.emitted += 1
                    decode += 1
                    u.generated = l.sent
                    u.ttft_ms = 95.0
                    u.tok_s_live = self.step_hz - 1.5 + jitter
                    u.itl_p50_ms, u.itl_p95_ms, u.itl_max_ms = 40.0 + jitter, 52.0 + jitter, 70.0 + l.sent % 13
                    if l.sent >= self.tokens:
                        u.phase, u.done_reason, u.tok_s = Phase.DONE, DoneReason.LENGTH, self.step_hz - 1.0
                if u.phase is Phase.DONE:
                    del self._live[rid]
                updates.append(u)
            running = len(self._live)
        return StepReport(self.steps, t, 38.0 + jitter, decode, prefill, 64, 400 + 8 * self.steps, 8192,
                          0, running, self.policy, updates)


@dataclass
class CpuConfig:
    panes: int = 8
    step_hz: float = 25.0
    duration_s: float = 10.0
    tokens: int = 400  # per reply; a pane that finishes is given another turn at once
    key_interval_s: float = 0.25
    size: tuple = (160, 50)
    show_sequences: bool = False  # f2: the sequences panel open as well
    profile: str | None = None  # write a cProfile of the measured window (the app thread) here


@dataclass
class CpuResult:
    config: dict
    wall_s: float
    process_cpu_s: float
    engine_thread_cpu_s: float
    app_cores: float  # (process CPU - stand-in engine thread CPU) / wall
    steps: int
    tokens: int
    frames: int
    keys: list = field(default_factory=list)  # latency ms per key (None: never painted within 2 s)
    key_p50_ms: float | None = None
    key_p95_ms: float | None = None
    key_max_ms: float | None = None

    def summary(self) -> str:
        f = lambda v: "—" if v is None else f"{v:.0f}"  # noqa: E731
        c = self.config
        return (f"{c['panes']} panes at {c['step_hz']:g} steps/s for {self.wall_s:.1f} s: "
                f"app {self.app_cores:.3f} cores (process {self.process_cpu_s:.2f} s CPU, "
                f"stand-in engine {self.engine_thread_cpu_s:.2f} s) · {self.tokens} tokens · "
                f"{self.frames} frames · keypress p50 {f(self.key_p50_ms)} ms p95 {f(self.key_p95_ms)} ms "
                f"max {f(self.key_max_ms)} ms ({len(self.keys)} keys)")


async def run_cpu(cfg: CpuConfig = CpuConfig()) -> CpuResult:
    """One headless run of the real app on the paced stand-in engine (see the module doc)."""
    from magnitude_bench.ui import prompts
    from magnitude_tui.widgets.chat_pane import ChatPane
    from magnitude_tui.widgets.composer import Composer

    client = PacedClient(step_hz=cfg.step_hz, tokens=cfg.tokens)

    async def measure(app, pilot, probe: FrameProbe) -> CpuResult:
        panes = await open_panes(app, pilot, cfg.panes)
        if cfg.show_sequences:
            await pilot.press("f2")
        texts = prompts(len(panes))

        def feed() -> None:  # every idle pane gets a turn (what pressing Enter in it does)
            for pane, text in zip(panes, texts):
                if not pane.busy and not pane.has_ended:
                    pane.post_message(ChatPane.Submitted(pane, text))

        feed()
        composer = panes[0].query_one(Composer)
        composer.focus()
        await asyncio.sleep(0.5)  # every pane past prefill and streaming

        keys: list[float | None] = []
        steps0, tokens0, frames0, eng0 = client.steps, client.emitted, probe.frames, client.thread_cpu_s
        profiler = None
        if cfg.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        cpu0, t0 = time.process_time(), time.perf_counter()
        end = t0 + cfg.duration_s
        i = 0
        while time.perf_counter() < end:
            feed()
            keys.append(await type_and_time_key(probe, composer, i))
            i += 1
            await asyncio.sleep(cfg.key_interval_s)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        eng = client.thread_cpu_s - eng0
        if profiler is not None and cfg.profile:
            profiler.disable()
            profiler.dump_stats(cfg.profile)
        return CpuResult(config=asdict(cfg), wall_s=wall, process_cpu_s=cpu, engine_thread_cpu_s=eng,
                         app_cores=max(0.0, cpu - eng) / wall, steps=client.steps - steps0,
                         tokens=client.emitted - tokens0, frames=probe.frames - frames0,
                         **KeyFigures.fields_of(keys))

    return await run_on_stand_in(client, "cpu.db", cfg.size, measure)


def run_cpu_bench(cfg: CpuConfig = CpuConfig(), reps: int = 1) -> list[CpuResult]:
    return [asyncio.run(run_cpu(cfg)) for _ in range(reps)]
