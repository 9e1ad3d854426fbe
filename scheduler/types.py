"""Provides the plain data that crosses the scheduler's edges: requests, plans, per-step reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum


class Phase(str, Enum):
    """What the user sees a sequence doing."""

    LOADING = "loading"  # model not resident yet
    QUEUED = "queued"  # waiting for a sequence slot or KV room
    PREPARING = "preparing"  # chat template + tokenization
    PREFILL = "prefill"  # prompt rows being evaluated
    WAITING = "waiting"  # remote: sent to the server, no token yet (its prefill is not visible)
    GENERATING = "generating"
    DONE = "done"


class DecodeOutcome(str, Enum):
    """What one native step did: llama_decode's return codes, typed (llama.h)."""

    OK = "ok"  # 0
    NO_KV_SLOT = "no_kv_slot"  # 1: recoverable, retry smaller or free KV
    ABORTED = "aborted"  # 2: abort callback fired
    INVALID_BATCH = "invalid_batch"  # -1
    FATAL = "fatal"  # < -1

    @classmethod
    def from_code(cls, code: int) -> "DecodeOutcome":
        if code == 0:
            return cls.OK
        if code == 1:
            return cls.NO_KV_SLOT
        if code == 2:
            return cls.ABORTED
        if code == -1:
            return cls.INVALID_BATCH
        return cls.FATAL


class DoneReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


class ErrorKind(str, Enum):
    """Why a request ended with `error`, for callers that answer differently (HTTP 400 vs 500)."""

    INVALID = "invalid_request"  # the request itself is wrong (a field, an id, an empty prompt)
    CONTEXT_LENGTH = "context_length_exceeded"  # the prompt does not fit a sequence or the cache
    FAILED = "failed"  # the engine or backend failed while running it


class Priority(IntEnum):
    """Who is waiting for a request; a lower value goes first (admission, prompt rows) and is
    preempted last. A person typing must never wait behind a crowd of agents."""

    INTERACTIVE = 0  # a person's turn in a pane
    AGENT = 1  # subagents, API requests
    BACKGROUND = 2  # bursts, API requests that ask for a low priority

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 256
    # The reply ends (reason `stop`) where one of these texts first appears in it, matched on the
    # detokenized text across token boundaries; the stop text and anything after it are never shown.
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made (or a caller replays in its history)."""

    id: str
    name: str
    arguments: str  # JSON text of an object, as OpenAI carries it


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    name: str | None = None  # a tool turn: the function that produced it


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its JSON-schema `parameters` kept as JSON text (hashable)."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object"}'


class ToolChoiceMode(str, Enum):
    NONE = "none"  # never call; the tools are still shown to the model
    AUTO = "auto"  # free text until the model opens a call; the call itself is constrained
    REQUIRED = "required"  # at least one call, constrained from the first token
    FUNCTION = "function"  # this one function, constrained from the first token


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None  # with FUNCTION


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar a sequence samples under (llama.cpp's grammar sampler)."""

    gbnf: str
    root: str = "root"


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call as it streams: the first piece of a call carries its id and name,
    later ones only more of its arguments' JSON text (OpenAI's `delta.tool_calls` entries)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Request:
    """One turn of one conversation: render `messages` with the chat template and generate a reply.

    `session_id` names the conversation; its KV stays resident between turns so the next turn
    prefills only what is new. `fork_from` names a parent session whose committed KV prefix the new
    session starts from (a spawned subagent).
    """

    request_id: str
    session_id: str
    messages: tuple[Message, ...]
    sampling: SamplingParams = SamplingParams()
    fork_from: str | None = None
    # Pre-tokenized prompt (skips the chat template); used by benchmarks and tests.
    prompt_tokens: tuple[int, ...] | None = None
    # Raw completion (a base model, POST /v1/completions, a /raw pane): this text is continued as
    # is, without the chat template; `messages` are not sent. Never parsed for special tokens.
    prompt: str | None = None
    priority: Priority = Priority.INTERACTIVE
    # Tool use and structured output (docs/design/tools.md): the functions shown to the model, how
    # it may call them, and a JSON schema the whole reply must satisfy (None: free text).
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    response_schema: str | None = None
    # A conversation too long for its sequence drops its oldest turns (a pane); False refuses it
    # instead (context_length_exceeded): an API caller must be told, never answered on a cut history.
    drop_oldest_turns: bool = True


@dataclass(frozen=True, slots=True)
class SeqSlice:
    """Consecutive rows of one sequence in one batch: tokens at positions pos0, pos0+1, ..."""

    seq_id: int
    pos0: int
    tokens: tuple[int, ...]
    want_logits: bool  # the LAST row of the slice produces logits (decode rows, final prompt chunk)
    is_decode: bool
    # Speculation: the last `n_draft` tokens are guesses to verify (a decode slice only). The decode
    # row and every draft row then produce logits: row i's logits judge draft token i + 1.
    n_draft: int = 0

    @property
    def n_logits(self) -> int:
        """How many rows of this slice (its last ones) produce logits."""
        return (1 + self.n_draft) if self.want_logits else 0


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """What the next native step evaluates. Only the backend turns this into a llama_batch."""

    step: int
    slices: tuple[SeqSlice, ...]
    budget: int

    @property
    def n_rows(self) -> int:
        return sum(len(s.tokens) for s in self.slices)

    @property
    def n_decode(self) -> int:
        """Decode rows: one per generating sequence (its draft rows are counted apart)."""
        return sum(len(s.tokens) - s.n_draft for s in self.slices if s.is_decode)

    @property
    def n_draft(self) -> int:
        """Draft rows: speculated tokens the step verifies beside the decode rows."""
        return sum(s.n_draft for s in self.slices)

    @property
    def n_prefill(self) -> int:
        return sum(len(s.tokens) for s in self.slices if not s.is_decode)

    @property
    def attention_kpos(self) -> float:
        """Thousands of (row, cached position) pairs the step attends over: a row at position q
        attends q + 1 positions, so the same rows cost more deep in a long context."""
        return sum(attended_kpos(s.pos0, len(s.tokens)) for s in self.slices)


def attended_kpos(pos0: int, rows: int) -> float:
    """Attention work of `rows` consecutive rows starting at position `pos0`, in thousands."""
    return (rows * pos0 + rows * (rows + 1) / 2) / 1000.0


class AttentionPath(str, Enum):
    """Which cells a row's attention really reads, as the backend's attention kernel computes it.

    llama.cpp sizes the attention of a step by `n_kv`, the highest used cell of the (unified) cache
    rounded up to 256. With flash attention each row skips the cells its mask hides, so it pays for
    its own visible positions only. Without it, every row multiplies against all `n_kv` cells and
    masks afterwards: every resident cell, an idle conversation's included, costs every row.
    """

    FLASH = "flash"  # a row reads its own visible cells
    DENSE = "dense"  # a row reads every used cell of the cache


# llama.cpp pads the cells a step attends over to a multiple of this (llama_kv_cache::get_n_kv).
KV_PAD = 256


def used_cells_kpos(cells_used: int, rows: int) -> float:
    """Attention work of `rows` rows that each read the whole used cell range, in thousands."""
    n_kv = -(-max(cells_used, 1) // KV_PAD) * KV_PAD
    return rows * n_kv / 1000.0


def plan_kpos(plan: "BatchPlan", path: AttentionPath, cells_used: int) -> float:
    """The attention work of a step under `path`; `cells_used` are the cells resident before it."""
    if path is AttentionPath.DENSE:
        return used_cells_kpos(cells_used + plan.n_rows, plan.n_rows)
    return plan.attention_kpos
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
    # A remote engine's request: which server runs it, whether the token counts are estimates
    # (the server sent no usage), and the server's own timings when it reports them.
    endpoint: str | None = None
    tokens_estimated: bool = False
    server_timings: ServerTimings | None = None
    # Speculation: draft tokens verified for this request so far, how many were accepted, and
    # the tokens it gained per generating step (1.0 without speculation).
    drafted: int = 0
    accepted: int = 0
    tokens_per_step: float | None = None
    # An agent whose decode row sat out this step so that a person's prompt gets its rows sooner.
    yielding: bool = False
    # Tool calls parsed out of the reply this step (their text is not in text_delta).
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # Time spent masking this request's rows under its grammar so far (0: unconstrained).
    grammar_ms: float = 0.0

    @property
    def acceptance(self) -> float | None:
        """Share of verified draft tokens that were accepted (None before any was drafted)."""
        return self.accepted / self.drafted if self.drafted else None


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
