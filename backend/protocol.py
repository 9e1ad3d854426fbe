"""Provides the Backend protocol every backend (llama.cpp, fake, simulated) satisfies."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from scheduler.cost_model import CostParams
from scheduler.types import AttentionPath, BatchPlan, DecodeOutcome, Grammar, Message, SamplingParams, Tool

if TYPE_CHECKING:
    from backend.attention import AttentionChoice
    from backend.tools import ToolSyntax

__all__ = ["Backend", "Clock", "DecodeOutcome", "DecodeResult", "Detokenizer", "KvStateError", "PlanError",
           "WALL_CLOCK", "check_plan"]


@dataclass
class DecodeResult:
    outcome: DecodeOutcome
    step_ms: float  # wall time of the step including device synchronisation
    logit_rows: dict[int, int]  # seq_id -> batch row holding that sequence's logits
    code: int = 0
    # Speculation: seq_id -> the rows after its decode row, in order, whose logits judge its draft
    # tokens (row i follows draft token i); only for slices that carried drafts.
    draft_rows: dict[int, tuple[int, ...]] = field(default_factory=dict)


class PlanError(ValueError):
    """A plan violates a native contract (rows > n_batch, bad seq id, position gap).

    Raised in Python before llama_decode, whose native asserts would abort the process.
    """


def check_plan(plan: BatchPlan, *, n_batch: int, n_seq_max: int, n_ctx_seq: int, n_vocab: int,
               next_pos: Callable[[int], int]) -> None:
    """Raise PlanError for anything llama_decode would assert on (or silently get wrong).

    Every backend runs this before a step, so the fake and simulated backends hold the planner to
    exactly the contract the real one enforces. `next_pos(seq)` is where that sequence's cache
    continues.
    """
    if plan.n_rows == 0:
        raise PlanError("empty plan")
    if plan.n_rows > n_batch:
        raise PlanError(f"plan has {plan.n_rows} rows, over n_batch={n_batch}")
    seen = set()
    for s in plan.slices:
        if not 0 <= s.seq_id < n_seq_max:
            raise PlanError(f"seq id {s.seq_id} outside 0..{n_seq_max - 1}")
        if s.seq_id in seen:
            raise PlanError(f"seq {s.seq_id} appears twice in one plan")
        seen.add(s.seq_id)
        if not s.tokens:
            raise PlanError(f"seq {s.seq_id}: empty slice")
        expected = next_pos(s.seq_id)
        if s.pos0 != expected:
            raise PlanError(f"seq {s.seq_id}: slice starts at position {s.pos0}, cache continues at {expected}")
        if s.n_draft and (not s.is_decode or not s.want_logits or s.n_draft >= len(s.tokens)):
            raise PlanError(f"seq {s.seq_id}: {s.n_draft} draft rows in a slice of {len(s.tokens)} that is "
                            "not a decode slice with logits")
        if s.pos0 + len(s.tokens) > n_ctx_seq:
            raise PlanError(f"seq {s.seq_id}: positions up to {s.pos0 + len(s.tokens)} exceed the context ({n_ctx_seq})")
        bad = [t for t in s.tokens if not 0 <= t < n_vocab]
        if bad:
            raise PlanError(f"seq {s.seq_id}: token {bad[0]} outside the vocab (n_vocab={n_vocab})")


class KvStateError(RuntimeError):
    """A saved sequence state could not be restored (another layout, damaged, no room); the
    sequence it was loaded into is left empty."""


class Clock(Protocol):
    """The time a backend's steps take place in: wall time, or a simulation's virtual seconds."""

    def __call__(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """Real time (perf_counter); sleeping really sleeps."""

    def __call__(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


WALL_CLOCK = WallClock()


class Detokenizer(Protocol):
    def feed(self, token: int) -> str: ...
    def flush(self) -> str: ...


class Backend(Protocol):
    """Everything the engine, the worker and the benchmarks read from a backend."""

    n_ctx: int  # KV cells, shared by all sequences
    n_ctx_seq: int  # the most positions one sequence may hold
    # One pool of cells every row's attention spans and forks share (llama.cpp's unified cache);
    # False: a stream per sequence, each row reading its own, a fork a copy of its parent's.
    kv_shared_pool: bool
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_vocab: int
    name: str  # e.g. "llama.cpp CPU", "fake", "simulated rx9070xt"
    model_name: str  # the GGUF file name, or the stand-in's name
    device_name: str  # where the steps run: "CPU", a Vulkan device, "simulated rx9070xt"
    info: dict[str, Any]  # model facts for EngineReady (size, parameters, threads...)
    clock: Clock  # the time step costs and request metrics are measured in
    # Which cells a row's attention reads (llama.cpp: flash attention on or off); the cost model
    # prices rows, and idle conversations' resident KV, by it.
    attention_path: AttentionPath
    # CPU threads a step runs on, and the most it may use (0 and 0: a backend with no CPU threads
    # to choose); the engine may change the count between steps with `set_n_threads`.
    n_threads: int
    max_threads: int
    # What a saved sequence state fits (model file, build, KV cache types, attention path): a state
    # saved under another layout is never handed to kv_load.
    state_layout: str
    # Steps with fewer rows than this run attention one row at a time, dearer per row deep in a
    # context (llama.cpp's CPU flash-attention kernel: 64); 0 when the kernel has no such step.
    attention_tile_rows: int
    # On the dense path on a CPU, the most prompt rows x resident cells a step's attention scores
    # (one float per row, cell and head) stay quick at: beyond it they no longer fit the cache and
    # each row costs more (backend/attention.py); 0 when no such bound is known.
    dense_kq_cells: int
    # Texts that end a reply rendered with the chat template: the ChatML fallback's markers when
    # the model has no template and its vocabulary no token for them (backend/template_fallback.py).
    chat_stops: tuple[str, ...]

    # Read-only for the engine (properties here, so that a backend that always has one may say so).
    @property
    def known_costs(self) -> CostParams | None:
        """A simulated backend's step costs, known exactly (no calibration); None for real hardware."""
        ...

    @property
    def attention(self) -> AttentionChoice | None:
        """The measured flash-attention choice behind `attention_path`, with the probe's timings at
        depth that the engine's calibration adds (llama.cpp); None for a stand-in, which has no probe."""
        ...

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]: ...
    # The tool-call form the chat template teaches the model (backend/tools.py).
    tool_syntax: ToolSyntax

    def tokenize_chat(self, messages: Sequence[Message], *, tools: Sequence[Tool] = (),
                      add_generation_prompt: bool = True) -> list[int]: ...
    def detokenizer(self) -> Detokenizer: ...
    def is_eog(self, token: int) -> bool: ...
    def token_bytes(self, token: int) -> bytes:
        """The token's text as bytes; b"" for a token with no text of its own (a control token)."""
        ...

    def decode(self, plan: BatchPlan) -> DecodeResult: ...
    def set_sampler(self, seq_id: int, params: SamplingParams, grammar: Grammar | None = None,
                    replay: Sequence[int] = ()) -> None:
        """The sequence's sampler chain; with a grammar, every token it samples is one the grammar
        allows, and `replay` (tokens already written under that grammar) is accepted first.
        GrammarError-like ValueError when the grammar does not compile."""
        ...
    def sample(self, seq_id: int, logit_row: int) -> int: ...
    def free_sampler(self, seq_id: int) -> None: ...
    def set_n_threads(self, n: int) -> None: ...

    def kv_remove(self, seq_id: int) -> None: ...
    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None: ...
    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None: ...
    def kv_pos_max(self, seq_id: int) -> int: ...  # -1 when empty
    def kv_cells_used(self) -> int: ...
    def kv_save(self, seq_id: int) -> bytes:
        """A copy of one sequence's KV cells (llama.cpp's per-sequence state), for kv_load later."""
        ...
    def kv_load(self, seq_id: int, state: bytes) -> int:
        """Replace `seq_id`'s KV with a state kv_save returned; the positions it now holds.
        KvStateError (and `seq_id` empty) when the state does not fit this context."""
        ...

    def close(self) -> None: ...
