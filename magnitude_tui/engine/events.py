"""Provides what crosses the engine's edge: its config, the commands it takes and the events it
sends (besides StepReport and SeqUpdate)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from backend.factory import BackendConfig
from scheduler.speculation import SpecMode
from scheduler.types import Request


@dataclass(frozen=True)
class EngineConfig:
    """How to build a local engine: the backend, then the engine's own settings."""

    backend: BackendConfig = BackendConfig()
    policy: str = "target:50"
    coalesce_ms: float = 5.0
    prepare_notice_chars: int | None = 8000  # a message this long is reported `preparing` before tokenizing
    # Speculative decoding (`--spec`): auto drafts where the cost model says it pays.
    spec: SpecMode = SpecMode.AUTO


# ---- worker -> app -------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0..1 from llama.cpp's progress callback
    model: str
    device: str
    stage: str = "loading weights"


@dataclass(frozen=True)
class EngineReady:
    model: str
    device: str
    n_ctx: int
    n_seq_max: int
    n_batch: int
    policy: str
    info: dict = field(default_factory=dict)
    spec: str = "off"  # the speculation mode it runs (--spec)


@dataclass(frozen=True)
class EngineFailed:
    """The engine cannot go on (load failed, worker died). Live requests were already failed."""

    message: str
    restartable: bool = True


@dataclass(frozen=True)
class CommandRejected:
    """A command could not be carried out (bad policy string, ...). The engine goes on."""

    message: str


@dataclass(frozen=True)
class PolicyChanged:
    policy: str


@dataclass(frozen=True)
class SpecChanged:
    spec: str


@dataclass(frozen=True)
class EndpointStatus:
    """One remote server as the client sees it (remote engines only)."""

    url: str
    healthy: bool
    in_flight: int  # requests streaming from it now
    queued: int  # requests waiting for one of its `limit` slots
    limit: int
    tok_s: float  # generated tokens per second over the last few seconds, all its requests
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    errors: int
    last_error: str | None = None


@dataclass(frozen=True)
class EndpointsReport:
    """The remote engine's servers, sent when something about them changed (a few times a
    second at most): the scheduler panel shows these instead of local step figures."""

    endpoints: tuple[EndpointStatus, ...]


# ---- app -> engine (the worker pipe carries the same values) -------------------------------

@dataclass(frozen=True)
class Submit:
    request: Request


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class CloseSession:
    session_id: str


@dataclass(frozen=True)
class SetPolicy:
    policy: str


@dataclass(frozen=True)
class SetSpec:
    mode: str  # off | ngram | draft | auto (SpecMode's values)


@dataclass(frozen=True)
class Shutdown:
    pass


# What the engine takes (Engine.submit & co. queue these; the worker pipe carries them as they are).
Command = Union[Submit, Cancel, CloseSession, SetPolicy, SetSpec, Shutdown]
