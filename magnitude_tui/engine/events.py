"""Provides what crosses the engine's edge: its config, the commands it takes and the events it
sends (besides StepReport and SeqUpdate)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Union

from backend.factory import BackendConfig
from scheduler.speculation import SpecMode
from scheduler.types import Message, Request

DEFAULT_WARM_BUDGET_MB = 1024  # saved conversation KV on disk, all models together (LRU beyond it)


@dataclass(frozen=True)
class EngineConfig:
    """How to build a local engine: the backend, then the engine's own settings."""

    backend: BackendConfig = BackendConfig()
    policy: str = "target:50"
    coalesce_ms: float = 5.0
    prepare_notice_chars: int | None = 8000  # a message this long is reported `preparing` before tokenizing
    # Choose the CPU thread count between steps from measured step times (engine/threads.py), up
    # to the CPUs this process may use; off, it stays at the backend's `n_threads`.
    auto_threads: bool = True
    # Where idle conversations' KV is saved for warm resume (None: not saved), and how many MB of
    # disk it may take there.
    warm_dir: str | None = None
    warm_budget_mb: int = DEFAULT_WARM_BUDGET_MB
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


class RestoreOutcome(str, Enum):
    """What became of a request to bring a conversation's saved KV back (warm resume)."""

    RESTORED = "restored"
    NOT_SAVED = "not_saved"  # nothing saved for it (new, never idle long enough, or over the disk budget)
    OTHER_LAYOUT = "other_layout"  # saved under another model file, llama.cpp build or KV settings
    CORRUPT = "corrupt"  # the file is damaged or truncated
    TOKENS_DIFFER = "tokens_differ"  # the conversation no longer starts with the saved tokens
    NO_ROOM = "no_room"  # no free slot or KV room without evicting anyone: it starts cold
    REFUSED = "refused"  # the backend would not take the state
    UNSUPPORTED = "unsupported"  # this engine keeps no saved KV (remote, or saving is off)


@dataclass(frozen=True)
class SessionRestored:
    """The answer to RestoreSession: with RESTORED, the conversation is resident and idle and its
    next turn prefills only what follows `tokens`; otherwise it starts cold, and `detail` says why."""

    session_id: str
    outcome: RestoreOutcome
    tokens: int = 0  # positions restored: the next turn's cached prefix
    load_ms: float = 0.0  # reading, checking and loading the state
    state_bytes: int = 0
    detail: str = ""


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
class RestoreSession:
    """Bring back the conversation's saved KV, as far as `messages` (what its next turn will send,
    without the generation prompt) still start with the saved tokens."""

    session_id: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class SetSpec:
    mode: str  # off | ngram | draft | auto (SpecMode's values)


@dataclass(frozen=True)
class Shutdown:
    pass


# What the engine takes (Engine.submit & co. queue these; the worker pipe carries them as they are).
Command = Union[Submit, Cancel, CloseSession, SetPolicy, SetSpec, RestoreSession, Shutdown]
