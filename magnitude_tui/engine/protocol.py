"""Provides EngineClient: the one interface the app, the workspace, `generate` and the benchmarks
use to talk to an engine, whichever engine it is.

Three kinds satisfy it: the local worker client (`engine.client.WorkerClient`, llama.cpp or a
stand-in backend in a worker process), the remote client (`remote.client.RemoteClient`, any
OpenAI-compatible server), and the tests' scripted clients.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

from magnitude_tui.engine.events import (
    CommandRejected,
    EndpointsReport,
    EngineFailed,
    EngineReady,
    LoadProgress,
    PolicyChanged,
    SeqUpdate,
    SessionRestored,
    SpecChanged,
    StepReport,
)
from scheduler.budget import Policy
from scheduler.speculation import SpecMode
from scheduler.types import Message, Request

# What an engine's event stream carries. A batch is one list of these: one per engine step for a
# local engine, one per network read for a remote one (never one per token).
EngineEvent = Union[LoadProgress, EngineReady, EngineFailed, PolicyChanged, SpecChanged, CommandRejected,
                    StepReport, SeqUpdate, EndpointsReport, SessionRestored]


def seq_updates(batch: list[EngineEvent]) -> list[SeqUpdate]:
    """Every sequence update in a batch: those inside step reports and those sent on their own
    (a request loading, failing before it ran, or ended by a dead engine)."""
    return [update for update, _ in timed_updates(batch)]


def timed_updates(batch: list[EngineEvent]) -> list[tuple[SeqUpdate, float | None]]:
    """seq_updates with the engine clock of each one's step (None for one sent on its own)."""
    out: list[tuple[SeqUpdate, float | None]] = []
    for event in batch:
        if isinstance(event, StepReport):
            out.extend((update, event.t) for update in event.updates)
        elif isinstance(event, SeqUpdate):
            out.append((event, None))
    return out


class EventStream:
    """The queue between a client's reader thread and its consumer: batches go in, `poll` takes
    one out; after `close()` the consumer gets None (the stream ended), as EngineClient promises."""

    _CLOSED = object()

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, batch: list[EngineEvent]) -> None:
        self._queue.put(batch)

    def close(self) -> None:
        self._queue.put(self._CLOSED)

    def poll(self, timeout: float | None = 0.0) -> list[EngineEvent] | None:
        try:
            batch = self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            return None
        return None if batch is self._CLOSED else batch


@dataclass(frozen=True)
class EngineTarget:
    """What a client will run on, known before it starts (the loading view names it)."""

    model: str  # a GGUF path or file name, a served model's name, or "" for the default model
    where: str  # a device ("auto", "cpu", "vulkan:0") or the endpoints' URLs


@runtime_checkable
class EngineClient(Protocol):
    """Commands go in (any order, any time after start); event batches come out of poll_events.

    Life cycle: `start()` loads or connects; the stream then brings LoadProgress, then EngineReady
    or EngineFailed. After EngineFailed(restartable=True), `restart()` tries again; `stop()` ends
    the stream for good. A request submitted before EngineReady is reported `loading` and runs
    once the engine is ready. Every submitted request ends with exactly one SeqUpdate whose phase
    is DONE (stop, length, cancelled or error), whatever happens to the engine.
    """

    @property
    def target(self) -> EngineTarget: ...

    @property
    def alive(self) -> bool:
        """The engine can take requests (loaded or loading; False after a death or stop)."""
        ...

    def start(self) -> None: ...
    def restart(self) -> None: ...
    def stop(self) -> None: ...

    def submit(self, request: Request) -> None: ...
    def cancel(self, request_id: str) -> None: ...
    def close_session(self, session_id: str) -> None: ...
    def forget(self, session_id: str) -> None:
        """The conversation was deleted: end it (as close_session) and delete whatever the engine
        saved of it (its KV on disk). Not answered."""
        ...
    def set_policy(self, policy: str | Policy) -> None:
        """Text is parsed by the client ("target:50"); answered in the stream by PolicyChanged or
        CommandRejected."""
        ...
    def restore_session(self, session_id: str, messages: tuple[Message, ...]) -> None:
        """Warm resume: bring back the conversation's saved KV, as far as `messages` (its
        conversation so far) still start with it. Answered in the stream by SessionRestored (an
        engine that keeps no saved KV answers UNSUPPORTED)."""
        ...

    def set_spec(self, mode: str | SpecMode) -> None:
        """Speculation off | ngram | draft | auto; answered by SpecChanged or CommandRejected."""
        ...

    def poll_events(self, timeout: float | None = 0.0) -> list[EngineEvent] | None:
        """One batch, or None when none arrived within `timeout` seconds (0: do not wait)."""
        ...
