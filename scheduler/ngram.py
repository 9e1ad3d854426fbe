"""Provides NgramSource: drafts looked up in a sequence's own tokens (prompt lookup decoding).

When a reply copies from its prompt (rewriting a code block, quoting a passage) or repeats
itself, the tokens that followed the last few tokens the previous time they occurred are a good
guess for what comes next. The guess costs no model: a dictionary per sequence, from each n-gram
to where it last ended, updated as tokens are committed.

A copy is followed, not looked up afresh each step: once a guess came from some earlier place, the
tokens committed since are checked against what follows that place, and while they agree the next
guess goes on from there. Code repeats its own n-grams (`(self, shelf: str` opens three methods),
so the latest occurrence of the last four tokens is often another line than the one being copied.
When a copy that ran a while breaks (a renamed identifier), the place it broke at is kept, and the
tokens the reply writes next are looked for just after it: the copy resumes there as soon as the
reply does, where the n-gram index would need a few tokens of the new name's context first.
"""

from __future__ import annotations

from typing import Sequence

from scheduler.drafts import DraftKind

__all__ = ["NgramIndex", "NgramSource"]

# Longest match first; a single token is not a match: in prose the token after " the" is a new
# word almost every time, and each wrong draft costs a verification row.
MAX_NGRAM = 4
MIN_NGRAM = 2
# A copy counts as established once this many of its tokens were committed in a row; only then
# is the place it breaks at kept to resume it (a chance 2-gram match in prose breaks at once).
COPY_RUN = 4
# After a break, where the reply's next tokens are looked for: this many source tokens from the
# break on, for as long as the reply has written at most RESYNC_SPAN tokens since it.
RESYNC_WINDOW = 16
RESYNC_SPAN = 8
# How far back a match is measured beyond its n-gram (the evidence behind a guess, `match_length`);
# the policy only asks whether it reaches its long-match threshold.
MATCH_CAP = 32


class NgramIndex:
    """For each n-gram (n in MIN..MAX) of one sequence's tokens, the position where it last ended
    with at least one token after it: the suffix of the sequence itself is never its own match.
    Also the copy being followed: the position of the token it would take next."""

    def __init__(self, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}
        self._src: int | None = None  # the copy's next source position, as of `_at` tokens
        self._at = 0
        self._run = 0  # the copy's tokens committed in a row, its matched ones included
        self._broke: tuple[int, int] | None = None  # (source position, sequence position) of a break

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
        """Up to k tokens: the followed copy's next ones while the reply keeps to it; after an
        established copy broke, what follows the reply's latest tokens just after the break; else
        what followed the longest suffix the last time it occurred."""
        toks = self.tokens
        self._follow()
        if self._src is None:
            found = self._resync() or self._latest()
            if found is None:
                return []
            self._src, self._run = found  # a new copy; its matched tokens count as its run
        self._at = len(toks)
        return toks[self._src:self._src + k]

    @property
    def match_length(self) -> int:
        """The verbatim agreement behind the latest guess: the followed copy's run, from the first
        token the sequence shares with its source place to the latest one (0 without a copy)."""
        return self._run if self._src is not None else 0

    def _latest(self) -> tuple[int, int] | None:
        """(source position, match length) after the longest suffix's latest earlier occurrence."""
        toks = self.tokens
        for n in range(min(self.max_n, len(toks)), self.min_n - 1, -1):
            end = self._last_end.get(tuple(toks[len(toks) - n:]))
            if end is not None:
                m = n  # the match may run back further than the longest indexed n-gram
                while m < MATCH_CAP and end - m >= 0 and toks[end - m] == toks[len(toks) - 1 - m]:
                    m += 1
                return end + 1, m
        return None

    def _follow(self) -> None:
        """Move the followed copy over the tokens committed since, or note where it broke."""
        if self._src is None:
            return
        toks, src, at = self.tokens, self._src, self._at
        i = 0
        while src < at and at + i < len(toks) and toks[src + i] == toks[at + i]:
            i += 1
        self._run += i
        if at + i == len(toks):
            self._src, self._at = src + i, at + i
            return
        if self._run >= COPY_RUN:
            self._broke = (src + i, at + i)
        self._src, self._run = None, 0

    def _resync(self) -> tuple[int, int] | None:
        """After an established copy broke: (source position, match length) after the nearest
        place, from the break on, whose tokens end as the reply's latest ones do (longest first).
        A match of one token must be the only one there: a newline or a comma recurs within a
        few tokens of code, a name's next token rarely does."""
        if self._broke is None:
            return None
        toks, (src, pos) = self.tokens, self._broke
        written = len(toks) - pos
        if written > RESYNC_SPAN:
            self._broke = None
            return None
        best, best_m, ties = None, 0, 0
        for q in range(src, min(src + RESYNC_WINDOW, pos, len(toks) - 1)):
            m = 0
            while m < written and m <= q - src and toks[q - m] == toks[len(toks) - 1 - m]:
                m += 1
            if m > best_m:
                best, best_m, ties = (q + 1, m), m, 0
            elif m == best_m:
                ties += 1
        return None if best_m == 1 and ties else best  # the break stays kept: it may resume later


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

    def match_length(self, key: int) -> int:
        index = self._index.get(key)
        return index.match_length if index is not None else 0

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
