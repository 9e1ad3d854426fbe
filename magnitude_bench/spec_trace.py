"""Provides the acceptance trace of `bench spec`: what each draft source proposed on the real model
and how much of it the sequence then committed, and a draft source that replays it on a simulated
backend (whose tokens it knows), so a simulated GPU sees the real model's acceptance.

A free source (n-gram lookup) is also judged at every position of each finished reply (`Reply`),
and the replay proposes the guess made at the simulated sequence's own position: the guesses the
real run happened to make follow the steps its policy took on the CPU (one every few tokens along
a copy where it drafted a few rows, one per token elsewhere, and none where no row could pay), a
mix no other hardware would see in that proportion or order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from scheduler.drafts import DraftKind, DraftSource, DraftWant, match_length, propose_all
from scheduler.speculation import K_MAX

if TYPE_CHECKING:
    from backend.fake import FakeBackend

__all__ = ["Guess", "RecordingSource", "Reply", "Trace", "TraceDrafts", "judge_reply"]


@dataclass(frozen=True)
class Guess:
    """One proposal: how many tokens were asked for and proposed, and how many of them, from the
    first, were the tokens the sequence went on to commit; `match_length`: the source's evidence
    behind it (see `scheduler.drafts.match_length`)."""

    asked: int
    proposed: int
    matched: int
    match_length: int = 0


@dataclass(frozen=True)
class Reply:
    """One finished reply judged at every position: `guesses[j]` is what a fresh source proposed
    (asked for K_MAX tokens) after the prompt and the reply's first j tokens, against the tokens
    the reply went on to commit (a guess running past the reply's end keeps only its judged
    tokens)."""

    prompt_len: int
    guesses: tuple[Guess, ...]


@dataclass
class Trace:
    """One source's trace on one task: the guesses the run made, and (a free source) its replies
    judged at every position."""

    guesses: list[Guess]
    replies: list[Reply] = field(default_factory=list)


def _matched(seen: Sequence[int], draft: Sequence[int]) -> int:
    """How many of the draft's tokens, from the first, the committed tokens `seen` repeat."""
    m = 0
    while m < len(seen) and seen[m] == draft[m]:
        m += 1
    return m


def judge_reply(source: DraftSource, prompt_len: int, tokens: Sequence[int]) -> Reply:
    """A fresh `source` asked once at every position of the reply that follows `prompt_len` tokens
    (in order, as an engine asks it, so a copy it follows is followed here too)."""
    tokens = list(tokens)
    out = []
    for pos in range(prompt_len, len(tokens)):
        draft = source.propose(0, tokens[:pos], K_MAX)
        seen = tokens[pos:pos + len(draft)]
        m = _matched(seen, draft)
        out.append(Guess(K_MAX, len(draft) if m < len(seen) else len(seen), m, match_length(source, 0)))
    source.forget(0)
    return Reply(prompt_len, tuple(out))


@dataclass
class _Pending:
    at: int  # committed tokens when it was proposed
    asked: int
    draft: tuple[int, ...]
    match_length: int = 0


class RecordingSource:
    """A DraftSource that passes everything to `inner` and judges each proposal against what the
    same sequence commits later (known at its next proposals; at temperature 0 the committed tokens
    do not depend on speculation, so the judgement holds for any mode).

    With `fresh` (a free source only: a draft model's guesses cost draft steps), each sequence's
    tokens when it ends are kept, and `replies()` judges them at every position with a new source
    from `fresh`: `inner`, whose state is the run's, is never asked more than the run asks it, and
    the judging happens after the run, outside its timed steps."""

    def __init__(self, inner: DraftSource, fresh: Callable[[], DraftSource] | None = None) -> None:
        if fresh is not None and inner.draft_ms(1, 1) != 0.0:
            raise ValueError("only a free source is judged at every position: a paid one's guesses cost steps")
        self.inner = inner
        self.kind: DraftKind = inner.kind
        self.guesses: list[Guess] = []
        self._pending: dict[int, list[_Pending]] = {}
        self._fresh = fresh
        self._views: dict[int, Sequence[int]] = {}  # each key's tokens, as last shown (a live view)
        self._ended: list[tuple[int, tuple[int, ...]]] = []  # (prompt length, tokens) of ended sequences

    def clear(self) -> None:
        """Forget every guess and reply recorded so far (a new task)."""
        self.guesses.clear()
        self._ended.clear()

    def replies(self) -> list[Reply]:
        """Every distinct ended reply, judged at every position by a fresh source."""
        if self._fresh is None:
            return []
        return [judge_reply(self._fresh(), n, toks) for n, toks in dict.fromkeys(self._ended)]

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        draft = self.inner.propose(key, tokens, k)
        self._record(key, tokens, k, draft, match_length(self.inner, key))
        return draft

    def match_length(self, key: int) -> int:
        return match_length(self.inner, key)

    def propose_many(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        out = propose_all(self.inner, wants)
        for w in wants:
            self._record(w.key, w.tokens, w.k, out.get(w.key, []))
        return out

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return self.inner.draft_ms(k, n_sequences)

    def forget(self, key: int) -> None:
        self._pending.pop(key, None)  # a proposal whose outcome was not seen yet is not judged
        view = self._views.pop(key, None)
        start = getattr(view, "prompt_len", None)  # a sequence's view knows where its reply starts
        if view is not None and start is not None and len(view) > start:
            self._ended.append((start, tuple(view[0:len(view)])))
        self.inner.forget(key)

    def _record(self, key: int, tokens: Sequence[int], k: int, draft: Sequence[int], evidence: int = 0) -> None:
        """Keep the sequence's view (a free source's replies), judge its earlier proposals against
        `tokens`, and hold this one until its tokens are seen."""
        if self._fresh is not None:
            self._views[key] = tokens
        self._judge(key, tokens)
        if k > 0:
            self._pending.setdefault(key, []).append(_Pending(len(tokens), k, tuple(draft), evidence))

    def _judge(self, key: int, tokens: Sequence[int]) -> None:
        left = []
        for p in self._pending.get(key, []):
            seen = tokens[p.at:p.at + len(p.draft)]
            m = _matched(seen, p.draft)
            if m < len(seen) or len(seen) == len(p.draft):  # a miss seen, or every token seen
                self.guesses.append(Guess(p.asked, len(p.draft), m, p.match_length))
            else:
                left.append(p)
        self._pending[key] = left


@dataclass
class TraceDrafts:
    """A DraftSource for a simulated backend (anything with `next_tokens(seq_id, k)`, i.e. the fake
    backend) that replays recorded guesses, proposing as many tokens as a guess did and making as
    many of them right as it matched; the rest are wrong tokens.

    With `replies`, a proposal takes the guess recorded at the sequence's own position in its reply
    (`tokens.prompt_len` on: a sequence's token view): a reply recorded after a prompt of the same
    length (the simulated prompts have the real ones' lengths), then the other replies in turn.
    Without, it takes the next recorded guess (cycling, each sequence from its own offset)."""

    backend: FakeBackend
    kind: DraftKind
    guesses: Sequence[Guess]
    step_ms: float = 0.0  # a draft model's cost per draft step on the simulated hardware (0: lookup)
    replies: Sequence[Reply] = ()
    _cursor: dict[int, int] = field(default_factory=dict)
    _evidence: dict[int, int] = field(default_factory=dict)  # the latest replayed guess's match_length
    _chain: dict[int, tuple[int, tuple[Guess, ...]]] = field(default_factory=dict)  # key -> its replies' guesses

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        if k <= 0:
            return []
        if self.replies:
            g = self._at_position(key, tokens)
        elif self.guesses:
            i = self._cursor.get(key, 7919 * key)
            self._cursor[key] = i + 1
            g = self.guesses[i % len(self.guesses)]
        else:
            return []
        self._evidence[key] = g.match_length
        n = min(k, g.proposed)
        truth = self.backend.next_tokens(key, n)
        return [t if j < g.matched else (t + 1) % self.backend.n_vocab for j, t in enumerate(truth)]

    def _at_position(self, key: int, tokens: Sequence[int]) -> Guess:
        start = tokens.prompt_len  # type: ignore[attr-defined]
        held = self._chain.get(key)
        if held is None or held[0] != start:
            same = [i for i, r in enumerate(self.replies) if r.prompt_len == start] or list(range(len(self.replies)))
            first = same[key % len(same)]
            order = list(self.replies[first:]) + list(self.replies[:first])
            held = self._chain[key] = (start, tuple(g for r in order for g in r.guesses))
        chain = held[1]
        return chain[(len(tokens) - start) % len(chain)] if chain else Guess(K_MAX, 0, 0)

    def propose_many(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        """Every want's guesses in one call, as a draft model drafts for all its sequences at once;
        the simulated hardware's clock is charged `draft_ms` for them (the draft steps take time
        there as they do on the real model, where the run's clock counts them)."""
        out = {w.key: self.propose(w.key, w.tokens, w.k) for w in wants}
        ms = self.draft_ms(max(map(len, out.values()), default=0), len(out))
        if ms > 0:
            self.backend.clock.sleep(ms / 1000.0)
        return out

    def draft_ms(self, k: int, n_sequences: int) -> float:
        return self.step_ms * k if k > 0 and n_sequences > 0 else 0.0

    def match_length(self, key: int) -> int:
        return self._evidence.get(key, 0)

    def forget(self, key: int) -> None:
        self._cursor.pop(key, None)
        self._evidence.pop(key, None)
        self._chain.pop(key, None)


def summary(guesses: Sequence[Guess]) -> dict:
    """Acceptance of a trace: mean tokens proposed and matched per guess, and matched / proposed."""
    proposed = sum(g.proposed for g in guesses)
    matched = sum(g.matched for g in guesses)
    return {"guesses": len(guesses), "proposed_mean": round(proposed / len(guesses), 2) if guesses else 0.0,
            "matched_mean": round(matched / len(guesses), 2) if guesses else 0.0,
            "match_rate": round(matched / proposed, 3) if proposed else None}
