"""Provides ScriptedClient, an EngineClient stepped by the test, and the app-test helpers built on it
(make_app, scripted_app, type_message, one_turn, queued_behind_a_reply, wait_for, settle; PACED)."""

from __future__ import annotations

import asyncio
import queue
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from magnitude_tui.app import MagnitudeApp
from magnitude_tui.engine.events import (
    CommandRejected,
    EngineFailed,
    EngineReady,
    LoadProgress,
    PolicyChanged,
    RestoreOutcome,
    SeqUpdate,
    SessionRestored,
    StepReport,
)
from magnitude_tui.engine.protocol import EngineTarget
from magnitude_tui.store import Store
from scheduler.types import DoneReason, Phase, Request, SamplingParams

SIZE = (120, 40)


@dataclass
class _Live:
    request: Request
    seq_id: int
    words: list[str]
    phase: Phase = Phase.QUEUED
    sent: int = 0
    prompt_total: int = 0
    cancelled: bool = False
    steps: int = 0
    text: list[str] = field(default_factory=list)
    dropped: int = 0  # messages the "engine" left out to fit the context


def default_reply(request: Request) -> str:
    last = request.messages[-1].content if request.messages else ""
    return f"Echo **{last[:24]}** with `code` done."


class ScriptedClient:
    """An EngineClient; nothing happens until the test calls step() (or ready()). Requests
    submitted before ready() are reported `loading` at the last load fraction, as the worker
    client reports them."""

    def __init__(self, *, auto_ready: bool = True, reply=default_reply, policy: str = "target:50"):
        self.auto_ready = auto_ready
        self.reply = reply
        self.policy = policy
        self.submitted: list[Request] = []
        self.cancelled: list[str] = []
        self.closed_sessions: list[str] = []
        self.restored: list[tuple[str, tuple]] = []  # restore_session calls: (session id, messages)
        self.forgotten: list[str] = []  # forget calls: conversations deleted
        self.live: dict[str, _Live] = {}
        self.step_no = 0
        self.drop_next = 0  # the next request reports this many of its oldest messages dropped
        self.started = 0
        self.emitted = 0  # batches put on the queue (quiet() compares it with what the app applied)
        self._queue: queue.Queue = queue.Queue()
        self._alive = False
        self._ready = False
        self._fraction = 0.0

    # ---- EngineClient API ---------------------------------------------------------------------

    @property
    def target(self) -> EngineTarget:
        return EngineTarget("scripted.gguf", "CPU")

    def start(self) -> None:
        self.started += 1
        self._alive = True
        self._ready = False
        self.load_progress(0.4)
        if self.auto_ready:
            self.ready()

    def submit(self, request: Request) -> None:
        self.submitted.append(request)
        seq_id = min(set(range(16)) - {l.seq_id for l in self.live.values()})
        words = [w + " " for w in self.reply(request).split(" ")]
        words[-1] = words[-1].rstrip()
        total = sum(len(m.content.split()) for m in request.messages) + 8
        self.live[request.request_id] = _Live(request, seq_id, words, prompt_total=total, dropped=self.drop_next)
        self.drop_next = 0
        if not self._ready:
            self._emit([self._loading_update(request)])

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        if request_id in self.live:
            self.live[request_id].cancelled = True

    def close_session(self, session_id: str) -> None:
        self.closed_sessions.append(session_id)
        for l in self.live.values():
            if l.request.session_id == session_id:
                l.cancelled = True

    def forget(self, session_id: str) -> None:
        self.forgotten.append(session_id)
        self.close_session(session_id)

    def restore_session(self, session_id: str, messages: tuple) -> None:
        """Recorded, and answered as an engine with nothing saved answers."""
        self.restored.append((session_id, tuple(messages)))
        self._emit([SessionRestored(session_id, RestoreOutcome.NOT_SAVED, detail="a scripted engine saves no KV")])

    def set_policy(self, policy: str) -> None:
        from scheduler.budget import parse_policy

        try:
            parse_policy(policy)
        except ValueError as exc:
            self._emit([CommandRejected(f"policy not changed: {exc}")])
            return
        self.policy = policy
        self._emit([PolicyChanged(policy)])

    def set_spec(self, mode: str) -> None:
        from magnitude_tui.engine.events import SpecChanged
        from scheduler.speculation import parse_spec_mode

        try:
            self.spec = parse_spec_mode(mode).value
            if self.spec == "draft":
                raise ValueError("--spec draft needs a draft source, and none is loaded")
        except ValueError as exc:
            self._emit([CommandRejected(f"speculation not changed: {exc}")])
            return
        self._emit([SpecChanged(self.spec)])

    def poll_events(self, timeout: float | None = 0.0) -> list | None:
        try:
            batch = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            return None
        return batch

    def restart(self) -> None:
        self.start()

    def stop(self) -> None:
        self._alive = False

    @property
    def alive(self) -> bool:
        return self._alive

    # ---- test controls ------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._ready

    def load_progress(self, fraction: float) -> None:
        self._fraction = fraction
        waiting = [self._loading_update(l.request) for l in self.live.values()]
        self._emit([LoadProgress(fraction, "scripted.gguf", "CPU"), *waiting])

    def ready(self) -> None:
        self._ready = True
        self._emit([LoadProgress(1.0, "scripted.gguf", "CPU"),
                    EngineReady("scripted.gguf", "CPU", 8192, 16, 2048, self.policy)])

    def fail_to_start(self, reason: str) -> None:
        """What the real client delivers when the load fails: the worker's reason, then the
        generic news that its process exited."""
        self._alive = False
        self._emit([EngineFailed(reason, restartable=False)])
        self._emit([EngineFailed("the engine worker (pid 1) exited with code 0; native log: engine.log. "
                                 "Restart the engine to continue.")])

    def _loading_update(self, request: Request) -> SeqUpdate:
        return SeqUpdate(request.request_id, request.session_id, None, Phase.LOADING,
                         load_fraction=self._fraction)

    def die(self, message: str = "the engine worker was killed by SIGKILL") -> None:
        batch: list[object] = [
            SeqUpdate(rid, l.request.session_id, None, Phase.DONE, done_reason=DoneReason.ERROR, error=message)
            for rid, l in self.live.items()
        ]
        self.live.clear()
        self._alive = False
        self._emit(batch + [EngineFailed(message)])

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self._step()

    def run_to_completion(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            if not self.live:
                return
            self._step()
        raise AssertionError(f"scripted replies still live after {max_steps} steps: {sorted(self.live)}")

    def _step(self) -> None:
        self.step_no += 1
        updates, decode, prefill = [], 0, 0
        for rid, l in list(self.live.items()):
            l.steps += 1
            u = SeqUpdate(rid, l.request.session_id, l.seq_id, l.phase, prompt_total=l.prompt_total,
                          queue_ms=12.0, dropped_messages=l.dropped, priority=l.request.priority)
            if l.cancelled:
                u.phase, u.done_reason = Phase.DONE, DoneReason.CANCELLED
            elif l.phase is Phase.QUEUED:
                u.phase = l.phase = Phase.PREFILL
                u.prompt_done, u.cached_tokens = l.prompt_total // 2, 4
                prefill += l.prompt_total // 2
            elif l.phase is Phase.PREFILL:
                l.phase = Phase.GENERATING
                u.phase, u.prompt_done, u.cached_tokens = Phase.GENERATING, l.prompt_total, 4
                prefill += l.prompt_total - l.prompt_total // 2
            if u.phase is Phase.GENERATING and not l.cancelled:
                u.prompt_done, u.cached_tokens = l.prompt_total, 4
                u.text_delta = l.words[l.sent]
                u.new_tokens = 1
                l.sent += 1
                decode += 1
                u.generated = l.sent
                u.ttft_ms, u.tok_s_live, u.itl_p50_ms, u.itl_p95_ms, u.itl_max_ms = 80.0, 20.0, 50.0, 55.0, 60.0
                if l.sent == len(l.words):
                    u.phase, u.done_reason, u.tok_s = Phase.DONE, DoneReason.STOP, 20.0
            if u.phase is Phase.DONE:
                del self.live[rid]
            updates.append(u)
        self._emit([StepReport(self.step_no, self.step_no * 0.05, 30.0 + (self.step_no % 5) * 8,
                               decode, prefill, 40, 300 + 10 * self.step_no, 8192,
                               0, len(self.live), self.policy, updates)])

    def _emit(self, batch: list[object]) -> None:
        self.emitted += 1
        self._queue.put(batch)


# The fake backend at a 2-core CPU's pace: a simulated backend is the fake (same replies) whose
# steps take a hardware profile's time, and with realtime=True it really sleeps them (~11 ms for
# one row, ~58 ms for eight). Unpaced, the fake decodes thousands of tokens a second (more once
# n-gram drafts are accepted), so an "endless" reply that a test means to cancel can reach its
# length limit first on a slow machine.
PACED = "simulated:cpu2core"


def make_app(tmp_path: Path, client=None, *, resume: bool = False, theme: str | None = None,
             sampling: SamplingParams | None = None, roles=None) -> MagnitudeApp:
    store = Store(tmp_path / "magnitude.db")
    return MagnitudeApp(client=client or ScriptedClient(),
                        store=store, theme=theme, resume=resume, export_dir=tmp_path / "exports",
                        sampling=sampling, roles=roles)


async def type_message(pilot, text: str) -> None:
    """Type `text` key by key into the focused composer and send it with Enter."""
    await pilot.press(*text, "enter")
    await pilot.pause()


@asynccontextmanager
async def scripted_app(tmp_path: Path):
    """The app on a fresh ScriptedClient, running headless at SIZE; yields (app, client, pilot)."""
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        yield app, client, pilot


@asynccontextmanager
async def remote_app(tmp_path: Path, *urls: str):
    """The app on a RemoteClient over `urls`, headless at SIZE, once it has checked its servers;
    yields (app, pilot)."""
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig

    app = make_app(tmp_path, RemoteClient(RemoteConfig(urls)))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the servers")
        yield app, pilot


async def one_turn(pilot, client: ScriptedClient, text: str) -> None:
    """Send `text`, let the scripted engine finish its reply, and wait until the app shows it all."""
    await type_message(pilot, text)
    client.run_to_completion()
    await settle(pilot)


@asynccontextmanager
async def queued_behind_a_reply(tmp_path: Path, *queued: str):
    """The app's one pane three tokens into its reply to "first", with `queued` typed behind it;
    yields (pilot, client, pane)."""
    async with scripted_app(tmp_path) as (app, client, pilot):
        [pane] = app.workspace.grid.panes
        await type_message(pilot, "first")
        client.step(3)
        await settle(pilot)
        for text in queued:
            await type_message(pilot, text)
        yield pilot, client, pane


async def wait_for(pilot, condition, timeout: float = 30.0, what: str = "condition") -> None:
    """Let the app run until condition() holds (engine-driven tests cannot count steps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def quiet(app) -> bool:
    """Everything the scripted engine sent is applied and painted: every batch taken in, no ended
    reply waiting for its paint, no buffered text or stale status in a visible pane."""
    ws = app.workspace
    if ws.link.batches_applied < ws.client.emitted:
        return False
    for pane in ws.grid.panes:
        if pane.has_ended:
            return False
        streaming = pane.replies.streaming
        if pane.display and ((streaming is not None and streaming.pending) or pane._status_dirty):
            return False
    return True


async def settle(pilot, what: str = "the app to apply and paint every engine batch") -> None:
    """Wait (by condition, never a fixed time: CI machines are slow) until quiet(), then let the
    messages that painting posted (a finished reply, a subagent's answer) be handled."""
    await wait_for(pilot, lambda: quiet(pilot.app), what=what)
    await pilot.pause()
    await wait_for(pilot, lambda: quiet(pilot.app), what=what)
