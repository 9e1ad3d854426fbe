"""Provides the progress events an agent loop reports (turns, text, tools, approval, subagents) for the TUI's `tool` phase and headless output."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Union

from magnitude_tui.agent.policy import Decision
from scheduler.types import ToolCall


class EndReason(str, Enum):
    ANSWERED = "answered"  # a turn ended without tool calls: its text is the answer
    MAX_TURNS = "max_turns"  # the turn bound came first
    FAILED = "failed"  # the engine ended a turn with an error
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TurnStarted:
    agent: str
    turn: int
    request_id: str


@dataclass(frozen=True)
class TurnRetry:
    """An attempt at a turn that the engine refused, after which the same turn was asked again."""

    attempt: int  # 1: the turn's first request
    reason: str  # why it was asked again (what was refused, what changed)
    error: str  # the engine's own words (a prompt it refused was never counted into prompt_tokens)


@dataclass(frozen=True)
class TurnRetried:
    """A turn's attempt was refused and the turn is asked again (one TurnFinished still follows)."""

    agent: str
    turn: int
    retry: TurnRetry


@dataclass(frozen=True)
class TurnFinished:
    """One turn done (once, however many attempts it took): how much of the prompt of the attempt
    that ran was already in the KV cache."""

    agent: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    generated: int
    calls: tuple[ToolCall, ...]
    retries: tuple[TurnRetry, ...] = ()  # the refused attempts before the one counted here

    @property
    def attempts(self) -> int:
        return len(self.retries) + 1


@dataclass(frozen=True)
class TextDelta:
    agent: str
    text: str


@dataclass(frozen=True)
class ApprovalWaiting:
    agent: str
    call: ToolCall


@dataclass(frozen=True)
class ApprovalDecided:
    agent: str
    call: ToolCall
    decision: Decision
    wait_s: float


@dataclass(frozen=True)
class ToolStarted:
    agent: str
    call: ToolCall


@dataclass(frozen=True)
class ToolFinished:
    agent: str
    call: ToolCall
    duration_s: float  # the call's own time (checks, preview, the run); never the wait for approval
    result_chars: int
    ok: bool
    result: str  # what the model reads (the transcript may show it folded)
    approval_wait_s: float | None = None  # how long someone took to approve or deny it; None: not asked


@dataclass(frozen=True)
class SubagentSpawned:
    agent: str  # the parent
    child: str
    session_id: str
    task: str
    role: str | None


@dataclass(frozen=True)
class AgentFinished:
    agent: str
    reason: EndReason
    answer: str
    error: str | None = None


AgentEvent = Union[TurnStarted, TurnRetried, TurnFinished, TextDelta, ApprovalWaiting, ApprovalDecided, ToolStarted,
                   ToolFinished, SubagentSpawned, AgentFinished]
# Called on the event loop for every event, in order; must not block.
AgentObserver = Callable[[AgentEvent], None]


def ignore(event: AgentEvent) -> None:
    """The observer of an agent nobody watches."""
