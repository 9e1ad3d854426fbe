"""Provides the plain data that crosses the scheduler's edges: requests, their phases and outcomes, plans."""

from __future__ import annotations

from dataclasses import dataclass
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
    # The reply runs to max_tokens: an end-of-generation token is kept as a token (it shows as no
    # text) and sampling goes on (llama-server's and vLLM's `ignore_eos`; benchmarks that hold the
    # work fixed send it).
    ignore_eos: bool = False


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
    source: str = ""  # the request fields it was built from ("tools", "response_format", or both)


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
    rounded up to 256. With flash attention each row skips the arithmetic of the cells its mask
    hides and pays mostly for its own visible positions; it still reads every hidden cell's mask,
    about a thirteenth of a visible cell's cost for a decode row on one CPU thread (the cost model
    leaves that out; docs/design/scheduler.md). Without it, every row multiplies against all `n_kv`
    cells and masks afterwards: every resident cell, an idle conversation's included, costs every
    row in full.
    """

    FLASH = "flash"  # a row computes its own visible cells
    DENSE = "dense"  # a row reads every used cell of the cache


# llama.cpp pads the cells a step attends over to a multiple of this (llama_kv_cache::get_n_kv).
KV_PAD = 256


def used_cells_kpos(cells_used: int, rows: int) -> float:
    """Attention work of `rows` rows that each read the whole used cell range, in thousands."""
    n_kv = -(-max(cells_used, 1) // KV_PAD) * KV_PAD
    return rows * n_kv / 1000.0


def plan_kpos(plan: "BatchPlan", path: AttentionPath, cells_used: int) -> float:
    """The attention work of a step under `path`; `cells_used` are the cells a dense row reads
    before it (KvLedger.span_cells)."""
    if path is AttentionPath.DENSE:
        return used_cells_kpos(cells_used + plan.n_rows, plan.n_rows)
    return plan.attention_kpos
