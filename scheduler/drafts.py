"""Provides the seam every speculative draft source satisfies (n-gram lookup, a draft model).

A draft source proposes the tokens it guesses a sequence will generate next; the target model
verifies them in the shared batch. Sources see only committed tokens: whatever the target model
rejected is never shown to them, so they stay in step with what the user sees.
"""

from __future__ import annotations

from enum import Enum
from typing import Protocol, Sequence

__all__ = ["DraftKind", "DraftSource"]


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
