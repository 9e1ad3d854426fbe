"""Provides the seam every speculative draft source satisfies (n-gram lookup, a draft model).

A draft source proposes the tokens it guesses a sequence will generate next; the target model
verifies them in the shared batch. Sources see only committed tokens: whatever the target model
rejected is never shown to them, so they stay in step with what the user sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol, Sequence, runtime_checkable

__all__ = ["BatchedDraftSource", "DraftKind", "DraftSource", "DraftWant", "MatchedSource", "match_length",
           "propose_all"]


class DraftKind(str, Enum):
    """Where drafts come from; `--spec` chooses among them (off and auto are policy, not sources)."""

    NGRAM = "ngram"  # lookup over the sequence's own prompt and output
    DRAFT_MODEL = "draft"  # a smaller model with the same vocabulary


class DraftSource(Protocol):
    kind: DraftKind

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` guessed next tokens for the sequence `key` whose committed tokens (prompt and
        output, in order) are `tokens`; fewer, or none, when the source has no good guess."""
        ...

    def draft_ms(self, k: int, n_sequences: int) -> float:
        """What proposing k tokens for each of n sequences costs in one step, in ms (0 for lookup;
        a draft model's k serial steps), so the policy can price drafting against its gain."""
        ...

    def forget(self, key: int) -> None:
        """The sequence ended, or its committed tokens were rewritten (preemption, a new turn)."""
        ...


@dataclass(frozen=True)
class DraftWant:
    """One sequence's ask in a step: its committed tokens and how many guesses it may verify."""

    key: int
    tokens: Sequence[int]
    k: int


@runtime_checkable
class BatchedDraftSource(DraftSource, Protocol):
    """A source that drafts for several sequences at once (a draft model: one step of the draft
    model per draft position, all sequences in its batch), so n sequences do not cost n times one."""

    def propose_many(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        """key -> up to k guesses for each want (what `propose` would give, one call for all)."""
        ...


def propose_all(source: DraftSource, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
    """Every want's guesses from one source: in one call when it drafts in batches, else in turn."""
    if isinstance(source, BatchedDraftSource):
        return source.propose_many(wants)
    return {w.key: source.propose(w.key, w.tokens, w.k) for w in wants}


@runtime_checkable
class MatchedSource(DraftSource, Protocol):
    """A source that can say how much verbatim agreement backs its latest guess for a key (n-gram
    lookup: the length of the run of tokens the sequence's latest ones share with the place the
    guess is copied from), the evidence the policy conditions its acceptance estimate on."""

    def match_length(self, key: int) -> int:
        """Tokens of agreement behind the latest guess proposed for `key` (0: none, or no guess)."""
        ...


def match_length(source: DraftSource, key: int) -> int:
    """The evidence behind a source's latest guess for `key`; 0 for a source that cannot say.

    Called per sequence per step: it looks the method up rather than asking
    `isinstance(source, MatchedSource)`, which checks every member of the protocol (~20 µs)."""
    measure = getattr(source, "match_length", None)
    return measure(key) if measure is not None else 0
