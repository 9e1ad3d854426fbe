"""Provides the acceptance trace of `bench spec`: what each draft source proposed on the real model
and how much of it the sequence then committed, and a draft source that replays it on a simulated
backend (whose tokens it knows), so a simulated GPU sees the real model's acceptance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from scheduler.drafts import DraftKind, DraftSource, DraftWant, match_length, propose_all

__all__ = ["Guess", "RecordingSource", "TraceDrafts"]


@dataclass(frozen=True)
class Guess:
    """One proposal: how many tokens were asked for and proposed, and how many of them, from the
    first, were the tokens the sequence went on to commit; `match_length`: the source's evidence
    behind it (see `scheduler.drafts.match_length`)."""

    asked: int
    proposed: int
    matched: int
    match_length: int = 0


@dataclass
class _Pending:
    at: int  # committed tokens when it was proposed
    asked: int
    draft: tuple[int, ...]
    match_length: int = 0


class RecordingSource:
    """A DraftSource that passes everything to `inner` and judges each proposal against what the
    same sequence commits later (known at its next proposals; at temperature 0 the committed tokens
    do not depend on speculation, so the judgement holds for any mode)."""

    def __init__(self, inner: DraftSource) -> None:
        self.inner = inner
        self.kind: DraftKind = inner.kind
        self.guesses: list[Guess] = []
        self._pending: dict[int, list[_Pending]] = {}

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        draft = self.inner.propose(key, tokens, k)
        self._judge(key, tokens)
        if k > 0:
            self._pending.setdefault(key, []).append(_Pending(len(tokens), k, tuple(draft),
                                                              match_length(self.inner, key)))
        return draft

    def match_length(self, key: int) -> int:
        return match_length(self.inner, key)

    def propose_many(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        out = propose_all(self.inner, wants)
        for w in wants:
            self._judge(w.key, w.tokens)
            if w.k > 0:
                self._pending.setdefault(w.key, []).append(_Pending(len(w.tokens), w.k, tuple(out.get(w.key, []))))
        return out

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return self.inner.draft_ms(k, n_sequences)

    def forget(self, key: int) -> None:
        self._pending.pop(key, None)  # a proposal whose outcome was not seen yet is not judged
        self.inner.forget(key)

    def _judge(self, key: int, tokens: Sequence[int]) -> None:
        left = []
        for p in self._pending.get(key, []):
            seen = tokens[p.at:p.at + len(p.draft)]
            m = 0
            while m < len(seen) and seen[m] == p.draft[m]:
                m += 1
            if m < len(seen) or len(seen) == len(p.draft):  # a miss seen, or every token seen
                self.guesses.append(Guess(p.asked, len(p.draft), m, p.match_length))
            else:
                left.append(p)
        self._pending[key] = left


@dataclass
class TraceDrafts:
    """A DraftSource for a simulated backend (anything with `next_tokens(seq_id, k)`, i.e. the fake
    backend) that replays recorded guesses: each proposal takes the next recorded guess (cycling,
    each sequence from its own offset), proposes as many tokens as it did, and makes as many of
    them right as it matched; the rest are wrong tokens."""

    backend: object
    kind: DraftKind
    guesses: Sequence[Guess]
    step_ms: float = 0.0  # a draft model's cost per draft step on the simulated hardware (0: lookup)
    _cursor: dict[int, int] = field(default_factory=dict)
    _evidence: dict[int, int] = field(default_factory=dict)  # the latest replayed guess's match_length

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        if not self.guesses or k <= 0:
            return []
        i = self._cursor.get(key, 7919 * key)
        self._cursor[key] = i + 1
        g = self.guesses[i % len(self.guesses)]
        self._evidence[key] = g.match_length
        n = min(k, g.proposed)
        truth = self.backend.next_tokens(key, n)
        return [t if j < g.matched else (t + 1) % self.backend.n_vocab for j, t in enumerate(truth)]

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return self.step_ms * k if k > 0 and n_sequences > 0 else 0.0

    def match_length(self, key: int) -> int:
        return self._evidence.get(key, 0)

    def forget(self, key: int) -> None:
        self._cursor.pop(key, None)
        self._evidence.pop(key, None)


def summary(guesses: Sequence[Guess]) -> dict:
    """Acceptance of a trace: mean tokens proposed and matched per guess, and matched / proposed."""
    proposed = sum(g.proposed for g in guesses)
    matched = sum(g.matched for g in guesses)
    return {"guesses": len(guesses), "proposed_mean": round(proposed / len(guesses), 2) if guesses else 0.0,
            "matched_mean": round(matched / len(guesses), 2) if guesses else 0.0,
            "match_rate": round(matched / proposed, 3) if proposed else None}
