"""Provides aligned_prompt: a prompt that spells a held conversation's text in other tokens takes
the held tokens for that text, so the conversation's cached KV covers it.

A model may generate a reply as tokens its tokenizer would not choose for that text (SmolLM2 wrote
" `" then "_" where the text tokenizes as " `_"). A client sends the reply back as text; tokenized
again, the prompt parts from the conversation's KV inside the reply, and every row after that point
is evaluated again: the rest of the reply and all that follows it, on the agent's next turn and on
each subagent forked from it. Where the prompt's bytes equal the held tokens' bytes, the held
tokens stand for them, so the model reads the tokens it wrote. A token with no text of its own
(a control token: BOS, a chat template's markers) is never matched by text, only as itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from scheduler.sequence import common_prefix_len

# A held conversation sharing fewer tokens than this with the prompt is not looked at byte by byte:
# its text parted from the prompt's in the chat template's first lines, not inside a reply.
MIN_SHARED = 16

TokenBytes = Callable[[int], bytes]  # a token's text as bytes; b"" for a control token


def aligned_prompt(prompt: list[int], held: Iterable[list[int]], token_bytes: TokenBytes,
                   max_len: int | None = None) -> list[int]:
    """`prompt`, or a copy in which the longest run of another held conversation's tokens that
    spells the same bytes replaces the prompt's own tokens for them. Unchanged when no held
    conversation's tokens part from the prompt's inside text they both spell, or when the copy
    would be longer than `max_len` tokens."""
    best, best_n = prompt, 0
    candidates = []
    for tokens in held:
        n = common_prefix_len(tokens, prompt)
        best_n = max(best_n, n)
        if MIN_SHARED <= n < min(len(tokens), len(prompt)):
            candidates.append((tokens, n))
    for tokens, n in candidates:
        spliced = _splice(prompt, tokens, n, token_bytes)
        if spliced is None or (max_len is not None and len(spliced) > max_len):
            continue
        m = common_prefix_len(tokens, spliced)
        if m > best_n:
            best, best_n = spliced, m
    return best


def _splice(prompt: list[int], held: list[int], n: int, token_bytes: TokenBytes) -> list[int] | None:
    """The prompt with held's tokens wherever the two part at `n` (and at every later parting) but
    spell the same bytes up to a shared token boundary; None when nothing could be taken."""
    current = prompt
    while n < min(len(held), len(current)):
        sync = _last_sync(held, current, n, token_bytes)
        if sync is None:
            break
        i, j = sync
        current = held[:i] + current[j:]
        n = common_prefix_len(held, current)  # at least i: the tokens after may match again
    return None if current is prompt else current


def _last_sync(held: list[int], prompt: list[int], n: int, token_bytes: TokenBytes) -> tuple[int, int] | None:
    """From position `n`, where the tokens differ, the furthest (i, j) with held[n:i] and
    prompt[n:j] spelling the same bytes; None when their bytes differ before any such boundary.
    The walk stops at the first byte that differs, at a control token, or at the end of either."""
    tokens = (held, prompt)
    spelled = (bytearray(), bytearray())
    at = [n, n]
    checked = 0
    sync = None
    while True:
        k = 0 if len(spelled[0]) <= len(spelled[1]) else 1  # the side whose bytes are behind
        if at[k] >= len(tokens[k]):
            break
        piece = token_bytes(tokens[k][at[k]])
        if not piece:
            break
        spelled[k].extend(piece)
        at[k] += 1
        m = min(len(spelled[0]), len(spelled[1]))
        if spelled[0][checked:m] != spelled[1][checked:m]:
            break
        checked = m
        if len(spelled[0]) == len(spelled[1]):
            sync = (at[0], at[1])
    return sync
