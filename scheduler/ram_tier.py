"""Provides RamTier: the KV of evicted idle conversations kept in host memory, so that their next
turn restores it instead of evaluating the whole history again."""

from __future__ import annotations

from collections import OrderedDict

from scheduler.sequence import common_prefix_len

# A conversation shorter than this is left to its next prefill: a handful of rows costs about
# what saving and restoring them would.
MIN_TOKENS = 64

# The default budget: llama-server's `--cache-ram` keeps up to 8 GiB of slot prompts; this engine's
# idle conversations stay resident in the context first, so the tier only holds what a slot or
# the cells were needed for. A 1,000-token conversation of SmolLM2-135M is about 23 MB.
DEFAULT_BYTES = 2 << 30
# The most best_prefix answers remembered between changes of the tier (one per waiting prompt).
BEST_MEMO = 64


class RamTier:
    """Saved sequence states by conversation, up to `budget` bytes; the oldest saved go first
    when a new one needs the room. A budget of 0 keeps nothing."""

    def __init__(self, budget: int = DEFAULT_BYTES) -> None:
        self.budget = max(0, budget)
        self.used = 0
        self._saved: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()
        self.saved_count = 0  # states kept, in all
        self.restored_count = 0  # states a slot took back (Residency.restore)
        # best_prefix's answers since the tier last changed: a request waiting for a slot asks
        # again every step, and hundreds of saved agent histories sharing thousands of tokens cost
        # milliseconds to weigh each time.
        self._best: dict[tuple[int, ...], tuple[str | None, int]] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._saved

    def __len__(self) -> int:
        return len(self._saved)

    def wants(self, tokens: list[int]) -> bool:
        """Whether a conversation holding `tokens` is worth saving."""
        return self.budget > 0 and len(tokens) >= MIN_TOKENS

    def put(self, session_id: str, tokens: list[int], state: bytes) -> bool:
        """Keep `state` (the first len(tokens) positions of `tokens`); False when it cannot fit."""
        self.drop(session_id)
        size = len(state)
        if size > self.budget:
            return False
        while self.used + size > self.budget:
            self.take(next(iter(self._saved)))
        self._saved[session_id] = (list(tokens), state)
        self._best.clear()
        self.used += size
        self.saved_count += 1
        return True

    def tokens(self, session_id: str) -> list[int] | None:
        saved = self.peek(session_id)
        return None if saved is None else saved[0]

    def all_tokens(self) -> list[list[int]]:
        """Every saved conversation's tokens (not copies: read them, do not change them)."""
        return [saved for saved, _ in self._saved.values()]

    def best_prefix(self, tokens: list[int]) -> tuple[str | None, int]:
        """The saved conversation sharing the longest prefix with `tokens`, and that length."""
        key = tuple(tokens)
        known = self._best.get(key)
        if known is not None:
            return known
        query = tokens if isinstance(tokens, list) else list(tokens)  # the saved tokens are lists
        best, best_n = None, 0
        for session_id, (saved, _) in self._saved.items():
            n = common_prefix_len(saved, query)
            if n > best_n:
                best, best_n = session_id, n
        if len(self._best) >= BEST_MEMO:
            self._best.clear()
        self._best[key] = (best, best_n)
        return best, best_n

    def peek(self, session_id: str) -> tuple[list[int], bytes] | None:
        """The saved tokens and state, still kept (warm resume copies them to disk)."""
        return self._saved.get(session_id)

    def take(self, session_id: str) -> tuple[list[int], bytes] | None:
        """The saved tokens and state, no longer kept."""
        saved = self._saved.pop(session_id, None)
        if saved is not None:
            self.used -= len(saved[1])
            self._best.clear()
        return saved

    def drop(self, session_id: str) -> None:
        self.take(session_id)
