"""Provides what crosses the engine's edge: its config, the commands it takes and the events it
sends (a StepReport per step with a SeqUpdate per request that changed, and the rare ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Union, get_args

from backend.factory import BackendConfig
from scheduler.budget import Policy
from scheduler.ram_tier import DEFAULT_BYTES as DEFAULT_RAM_BYTES
from scheduler.speculation import SpecMode
from scheduler.types import DecodeOutcome, DoneReason, ErrorKind, Message, Phase, Priority, Request, ToolCallDelta

DEFAULT_WARM_BUDGET_MB = 1024  # saved conversation KV on disk, all models together (LRU beyond it)
DEFAULT_KV_RAM_MB = DEFAULT_RAM_BYTES >> 20  # evicted conversations' KV in host memory


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
    # Host memory the KV of evicted idle conversations may take, in MB (scheduler/ram_tier.py):
    # their next turn restores it instead of evaluating the history again. 0: off.
    kv_ram_mb: int = DEFAULT_KV_RAM_MB
    # Speculative decoding (`--spec`): auto drafts where the cost model says it pays.
    spec: SpecMode = SpecMode.AUTO


# ---- engine -> app, every step -------------------------------------------------------------

@dataclass(frozen=True)
class ServerTimings:
    """What a llama-server reports about one reply (its `timings` object), in its own terms."""

    prompt_n: int  # prompt tokens it evaluated (not taken from its cache)
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int = 0  # prompt tokens reused from its cache

    @property
    def prompt_tok_s(self) -> float | None:
        return self.prompt_n / self.prompt_ms * 1000.0 if self.prompt_ms > 0 else None

    @property
    def predicted_tok_s(self) -> float | None:
        return self.predicted_n / self.predicted_ms * 1000.0 if self.predicted_ms > 0 else None


@dataclass(frozen=True)
class RemoteFacts:
    """A remote engine's request: which server runs it, whether the token counts are estimates
    (the server sent no usage), and the server's own timings when it reports them."""

    endpoint: str | None = None
    tokens_estimated: bool = False
    server_timings: ServerTimings | None = None


@dataclass(frozen=True)
class SpecFacts:
    """Speculation: draft tokens verified for a request so far, how many were accepted, and the
    tokens it gained per generating step (1.0 without speculation)."""

    drafted: int = 0
    accepted: int = 0
    tokens_per_step: float | None = None

    @property
    def acceptance(self) -> float | None:
        """Share of verified draft tokens that were accepted (None before any was drafted)."""
        return self.accepted / self.drafted if self.drafted else None


@dataclass
class SeqUpdate:
    """Everything the UI needs about one request after one step (only requests that changed)."""

    request_id: str
    session_id: str
    seq_id: int | None
    phase: Phase
    text_delta: str = ""
    new_tokens: int = 0
    prompt_done: int = 0
    prompt_total: int = 0
    cached_tokens: int = 0
    generated: int = 0
    # TTFT in three phases that add up to it: preparing (template + tokenizer), queue (waiting
    # for a slot, KV room or prompt rows) and prefill (first row scheduled -> first token).
    queue_ms: float | None = None
    ttft_ms: float | None = None
    preparing_ms: float | None = None
    prefill_ms: float | None = None
    tok_s_live: float | None = None
    tok_s: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_max_ms: float | None = None
    done_reason: DoneReason | None = None
    error_kind: ErrorKind | None = None  # with done_reason ERROR
    error: str | None = None
    waiting_reason: str | None = None
    # How many of the request's oldest messages (after its system messages) were left out so the
    # conversation fits its sequence with room for a reply (0: all of it was sent).
    dropped_messages: int = 0
    priority: Priority = Priority.INTERACTIVE
    load_fraction: float | None = None  # phase `loading`: how much of the model is loaded (0..1)
    remote: RemoteFacts = RemoteFacts()  # a remote engine's request (defaults: a local one)
    spec: SpecFacts = SpecFacts()
    # An agent whose decode row sat out this step so that a person's prompt gets its rows sooner.
    yielding: bool = False
    # Tool calls parsed out of the reply this step (their text is not in text_delta).
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # Time spent masking this request's rows under its grammar so far (0: unconstrained).
    grammar_ms: float = 0.0


class RejectReason(str, Enum):
    DUPLICATE_ID = "duplicate_id"  # another request with this id is still live
    BAD_ID = "bad_id"  # the request id is missing or not text: no update could carry it
    MALFORMED = "malformed"  # not a request at all, or a command the engine cannot apply


@dataclass(frozen=True)
class Rejection:
    """A submit the engine refused without it ever becoming a request. Reported apart from the
    updates because its id may belong to another, live request, which must not look ended."""

    request_id: str  # as given (repr'd when it was not text)
    session_id: str | None
    reason: RejectReason
    message: str


@dataclass(frozen=True)
class ThreadState:
    """The engine's CPU thread count for the next step, its range, and why (shown to the user)."""

    n_threads: int
    max_threads: int
    why: str
    others_cores: float | None = None  # CPU other processes used lately, in cores (None: unknown)

    def short(self) -> str:
        busy = f" · others {self.others_cores:.1f} cores" if self.others_cores is not None else ""
        return f"{self.n_threads} of {self.max_threads}{busy}"


@dataclass(frozen=True)
class RamTierState:
    """The host-memory KV tier (scheduler/ram_tier.py) as a step left it."""

    used_bytes: int
    budget_bytes: int
    conversations: int  # evicted idle conversations whose KV it holds now
    restored: int  # conversations a slot took back from it since the engine started

    def short(self) -> str:
        mb = 1 << 20
        return (f"{self.used_bytes / mb:.0f}/{self.budget_bytes / mb:.0f} MB · {self.conversations} held · "
                f"{self.restored} restored")


@dataclass
class StepReport:
    """One per engine step: the step's shape and every request update it caused."""

    step: int
    t: float  # engine clock seconds
    step_ms: float
    decode_rows: int
    prefill_rows: int
    budget: int
    kv_used: int
    kv_total: int
    waiting: int
    running: int
    policy: str
    updates: list[SeqUpdate] = field(default_factory=list)
    # OK, or the outcome of a step that failed and committed nothing (e.g. NO_KV_SLOT).
    outcome: DecodeOutcome = DecodeOutcome.OK
    rejected: list[Rejection] = field(default_factory=list)
    # Cells only idle conversations hold (without flash attention they slow every row).
    kv_idle: int = 0
    threads: ThreadState | None = None  # None: the backend has no CPU threads to choose
    # Speculation: draft rows the step verified, how many of them were accepted, and the mode.
    draft_rows: int = 0
    draft_accepted: int = 0
    spec: str = "off"
    # Agents' decode rows held out of this step for a person's prompt in prefill.
    yielded_rows: int = 0
    ram: RamTierState | None = None  # None: the host-memory tier is off or has not been used yet


# ---- worker -> app -------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0..1 from llama.cpp's progress callback
    model: str
    device: str
    stage: str = "loading weights"


@dataclass(frozen=True)
class EngineInfo:
    """What a ready engine says about itself beyond its sizes: what the app shows or acts on."""

    n_ctx_seq: int = 0  # tokens one sequence may hold, prompt plus reply (0: unknown, a remote engine)
    attention: str | None = None  # the attention path its steps run, e.g. "flash (measured)"
    template_notice: str | None = None  # the model has no chat template: ChatML stands in (say so)
    draft_model: str | None = None  # the draft model it loaded for speculation
    warm_resume: str | None = None  # "off: why", when saved-KV resume was asked for and cannot run


@dataclass(frozen=True)
class EngineReady:
    model: str
    device: str
    n_ctx: int
    n_seq_max: int
    n_batch: int
    policy: str  # as shown, e.g. "target:50"
    info: EngineInfo = EngineInfo()
    spec: str = "off"  # the speculation mode it runs (--spec), as shown


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
    policy: str  # as shown, e.g. "fixed:16"


@dataclass(frozen=True)
class SpecChanged:
    spec: str  # as shown, e.g. "ngram"


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


# ---- app -> engine (the worker pipe carries the same values; Engine.apply takes each) --------

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
    """Switch the budget policy from the next step (parsed where it was typed: scheduler.budget)."""

    policy: Policy


@dataclass(frozen=True)
class RestoreSession:
    """Bring back the conversation's saved KV, as far as `messages` (what its next turn will send,
    without the generation prompt) still start with the saved tokens."""

    session_id: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class SetSpec:
    mode: SpecMode


@dataclass(frozen=True)
class ForgetSession:
    """The conversation was deleted: end it, as CloseSession does, and delete its saved KV (the
    tokens in it are the conversation's text)."""

    session_id: str


@dataclass(frozen=True)
class Shutdown:
    """The app is quitting: save the conversations whose latest reply is not saved yet."""


# What the engine takes: Engine.apply takes each as it is, and the worker pipe carries them.
Command = Union[Submit, Cancel, CloseSession, ForgetSession, SetPolicy, SetSpec, RestoreSession, Shutdown]
COMMANDS: tuple[type, ...] = get_args(Command)
