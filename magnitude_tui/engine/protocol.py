"""Provides EngineClient: the one interface the app, the workspace, `generate` and the benchmarks
use to talk to an engine, whichever engine it is.

Three kinds satisfy it: the local worker client (`engine.client.WorkerClient`, llama.cpp or a
stand-in backend in a worker process), the remote client (`remote.client.RemoteClient`, any
OpenAI-compatible server), and the tests' scripted clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union, runtime_checkable

from magnitude_tui.engine.events import (CommandRejected, EndpointsReport, EngineFailed, EngineReady,
                                         LoadProgress, PolicyChanged, SpecChanged)
from scheduler.types import Request, SeqUpdate, StepReport

# What an engine's event stream carries. A batch is one list of these: one per engine step for a
# local engine, one per network read for a remote one (never one per token).
EngineEvent = Union[LoadProgress, EngineReady, EngineFailed, PolicyChanged, SpecChanged, CommandRejected,
                    StepReport, SeqUpdate, EndpointsReport]


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
    def set_policy(self, policy: str) -> None:
        """Answered in the stream by PolicyChanged or CommandRejected."""
        ...

    def set_spec(self, mode: str) -> None:
        """Speculation off | ngram | draft | auto; answered by SpecChanged or CommandRejected."""
        ...

    def poll_events(self, timeout: float | None = 0.0) -> list[EngineEvent] | None:
        """One batch, or None when none arrived within `timeout` seconds (0: do not wait)."""
        ...
