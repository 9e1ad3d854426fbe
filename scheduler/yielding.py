"""Provides the rule by which agents' decode rows yield to a person's prompt in prefill."""

from __future__ import annotations

from scheduler.sequence import Sequence
from scheduler.types import Priority

# The longest an agent's stream is held for a person's prompt: once its last token is this old, it
# gets its decode row in the next step whatever is prefilling (its gap is then at most this plus
# one step). Nobody reads an agent's stream token by token; a person waits for their first token.
AGENT_HOLD_MS = 1000.0


def held_for_person(decoding: list[Sequence], prefilling: list[Sequence], now: float,
                    hold_ms: float = AGENT_HOLD_MS) -> list[Sequence]:
    """The generating agents (any class below INTERACTIVE) whose decode rows sit out this step
    because a person's prompt is in prefill: fewer decode rows leave the step's time to the
    prompt. An agent held `hold_ms` since its last token is not held again until it has one more."""
    if hold_ms <= 0 or not any(s.priority is Priority.INTERACTIVE for s in prefilling):
        return []
    held = []
    for s in decoding:
        last = s.metrics.t_last_token
        if s.priority > Priority.INTERACTIVE and last is not None and (now - last) * 1000.0 < hold_ms:
            held.append(s)
    return held
