"""Provides context fitting: a conversation too long for one sequence drops its oldest turns.

A conversation that has filled its sequence would otherwise fail every later turn ("the prompt
is N tokens but a sequence can hold only M"). So before a request is queued, its oldest turns
are dropped, whole turns at a time, keeping the leading system messages and the newest turns,
until the prompt leaves room for a reply. The request's update says how many messages were
dropped; the app then stops sending them, so the next turns share the trimmed prompt as a
prefix and reuse its KV again. The turns after the cut are evaluated again once (the cached
prefix ends where the old and new prompts first differ, right after the system prompt):
shifting the surviving cells' positions instead is not done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from scheduler.admission import ContextLengthError
from scheduler.types import Message

# A conversation is trimmed when its prompt leaves less than room for a reply (max_tokens, at most
# a quarter of the sequence); it is then trimmed until a quarter of the sequence is free, so the
# next few turns fit too and trimming (and the re-prefill it costs) happens rarely.
REPLY_SHARE = 4


@dataclass(frozen=True)
class Fitted:
    prompt: list[int]
    dropped: int  # messages dropped after the leading system messages


def reply_room(n_ctx_seq: int, max_tokens: int) -> int:
    """Tokens a prompt must leave free for its reply before the conversation is trimmed."""
    return max(1, min(max_tokens, n_ctx_seq // REPLY_SHARE))


def headroom(n_ctx_seq: int) -> int:
    """Tokens a trimmed prompt leaves free: the reply and the next turns."""
    return max(1, n_ctx_seq // REPLY_SHARE)


def turn_starts(messages: Sequence[Message], first: int) -> list[int]:
    """Indexes where a turn begins (a user message) after the system messages, oldest first."""
    return [i for i in range(first + 1, len(messages)) if messages[i].role == "user"]


def fit_conversation(messages: Sequence[Message], tokenize: Callable[[Sequence[Message]], list[int]],
                     n_ctx_seq: int, max_tokens: int, *, may_drop: bool = True) -> Fitted:
    """The prompt for `messages`; if it would leave no room for a reply of `reply_room` tokens, the
    oldest turns are dropped until `headroom` tokens are free. The last message is always kept
    (it is what is being asked). With `may_drop` False (an API caller, who must be told) such a
    prompt raises ContextLengthError instead, before any search for a cut: each try renders the
    whole template, and a 2,000-message history would hold up the engine's steps for it."""
    prompt = tokenize(messages)
    room = reply_room(n_ctx_seq, max_tokens)
    if len(prompt) + room <= n_ctx_seq:
        return Fitted(prompt, 0)
    if not may_drop:
        raise ContextLengthError(
            f"the conversation is {len(prompt):,} tokens; with room for a {room:,}-token reply a sequence "
            f"holds {n_ctx_seq - room:,}. Its oldest messages are not dropped for an API call: send a "
            "shorter history (or a smaller max_tokens)")
    room = headroom(n_ctx_seq)
    first = 0
    while first < len(messages) - 1 and messages[first].role == "system":
        first += 1
    starts = turn_starts(messages, first) or [len(messages) - 1]
    if starts[-1] != len(messages) - 1:
        starts.append(len(messages) - 1)  # the last message alone, whatever its role
    # Fewest turns dropped that fits: the prompt shrinks as the cut moves later, so bisect.
    lo, hi = 0, len(starts) - 1
    best: tuple[list[int], int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        cut = starts[mid]
        trimmed = tokenize([*messages[:first], *messages[cut:]])
        if len(trimmed) + room <= n_ctx_seq:
            best, hi = (trimmed, cut - first), mid - 1
        else:
            lo = mid + 1
    if best is None:  # even the newest message alone does not fit: the caller reports it
        cut = starts[-1]
        return Fitted(tokenize([*messages[:first], *messages[cut:]]), cut - first)
    return Fitted(*best)

