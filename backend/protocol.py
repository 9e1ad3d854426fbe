"""Provides the Backend protocol every backend (llama.cpp, fake, simulated) satisfies."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Protocol, Sequence

from scheduler.types import BatchPlan, Message, SamplingParams


class DecodeOutcome(str, Enum):
    """llama_decode's return codes, typed (llama.h)."""

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


@dataclass
class DecodeResult:
    outcome: DecodeOutcome
    step_ms: float  # wall time of the step including device synchronisation
    logit_rows: dict[int, int]  # seq_id -> batch row holding that sequence's logits
    code: int = 0


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
        if s.pos0 + len(s.tokens) > n_ctx_seq:
            raise PlanError(f"seq {s.seq_id}: positions up to {s.pos0 + len(s.tokens)} exceed the context ({n_ctx_seq})")
        bad = [t for t in s.tokens if not 0 <= t < n_vocab]
        if bad:
            raise PlanError(f"seq {s.seq_id}: token {bad[0]} outside the vocab (n_vocab={n_vocab})")


class Detokenizer(Protocol):
    def feed(self, token: int) -> str: ...
    def flush(self) -> str: ...


class Backend(Protocol):
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_vocab: int
    name: str  # e.g. "llama.cpp CPU", "fake", "simulated rx9070xt"

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]: ...
    def tokenize_chat(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> list[int]: ...
    def detokenizer(self) -> Detokenizer: ...
    def is_eog(self, token: int) -> bool: ...

    def decode(self, plan: BatchPlan) -> DecodeResult: ...
    def set_sampler(self, seq_id: int, params: SamplingParams) -> None: ...
    def sample(self, seq_id: int, logit_row: int) -> int: ...
    def free_sampler(self, seq_id: int) -> None: ...

    def kv_remove(self, seq_id: int) -> None: ...
    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None: ...
    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None: ...
    def kv_pos_max(self, seq_id: int) -> int: ...  # -1 when empty
    def kv_cells_used(self) -> int: ...

    def close(self) -> None: ...
