"""Provides NgramSource: drafts looked up in a sequence's own tokens (prompt lookup decoding).

When a reply copies from its prompt (rewriting a code block, quoting a passage) or repeats
itself, the tokens that followed the last few tokens the previous time they occurred are a good
guess for what comes next. The guess costs no model: a dictionary per sequence, from each n-gram
to where it last ended, updated as tokens are committed.
"""

from __future__ import annotations

from typing import Sequence

from scheduler.drafts import DraftKind

__all__ = ["NgramIndex", "NgramSource"]

# Longest match first; a single token is not a match: in prose the token after " the" is a new
# word almost every time, and each wrong draft costs a verification row.
MAX_NGRAM = 4
MIN_NGRAM = 2


class NgramIndex:
    """For each n-gram (n in MIN..MAX) of one sequence's tokens, the position where it last ended
    with at least one token after it: the suffix of the sequence itself is never its own match."""

    def __init__(self, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; every n-gram that now has a successor is indexed at its latest end."""
        toks = self.tokens
        for t in tokens:
            end = len(toks) - 1  # n-grams ending here gain a successor with `t`
            for n in range(self.min_n, self.max_n + 1):
                if end - n + 1 < 0:
                    break
                self._last_end[tuple(toks[end - n + 1:end + 1])] = end
            toks.append(t)

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest suffix the last time it occurred."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            end = self._last_end.get(tuple(toks[len(toks) - n:]))
            if end is not None:
                return toks[end + 1:end + 1 + k]
        return []


class NgramSource:
    """The n-gram lookup draft source: one incremental index per sequence key."""

    kind = DraftKind.NGRAM

    def __init__(self, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[int, NgramIndex] = {}

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        index = self._synced(key, tokens)
        return index.lookup(k)

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return 0.0  # a dictionary lookup: nothing next to a step of a model

    def forget(self, key: int) -> None:
        self._index.pop(key, None)

    def _synced(self, key: int, tokens: Sequence[int]) -> NgramIndex:
        """The key's index, extended by the tokens committed since the last call. Tokens only ever
        grow between calls for one sequence; anything else (a shorter list, a different last known
        token) means the key now holds other tokens, and the index is rebuilt."""
        index = self._index.get(key)
        known = len(index.tokens) if index is not None else 0
        if index is None or known > len(tokens) or (known and tokens[known - 1] != index.tokens[-1]):
            index = self._index[key] = NgramIndex(self.min_n, self.max_n)
            known = 0
        if known < len(tokens):
            index.extend(tokens[known:])
        return index
