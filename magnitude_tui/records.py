"""Provides a pane's records: its messages as the app keeps them (an agent's tool turns among
them) and what the model is sent from them. The store saves them; the panes show them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from magnitude_tui.agents import AgentSettings
from scheduler.types import Message, ToolCall


@dataclass
class MessageRecord:
    role: str
    content: str
    complete: bool = True
    author: str | None = None
    done_reason: str | None = None
    inherited: bool = False  # context copied from the parent pane at spawn (sent, not shown)
    id: int | None = None  # assigned by the store
    # A reply asked again (retry) keeps its earlier answers: `content` is answer `shown` (from 0)
    # of len(others) + 1, the others in order around it. Only the shown one is sent to the model.
    others: list[str] = field(default_factory=list)
    shown: int = 0
    # An agent's tool turns: an assistant turn's calls (its content is the text before them, often
    # none), and a `tool` message's call it answers, whether the tool succeeded, how long it ran.
    tool_calls: tuple[ToolCall, ...] = ()
    call: ToolCall | None = None
    ok: bool = True
    duration_s: float | None = 0.0  # None: not known here (an API caller ran the tool)
    approval_wait_s: float | None = None

    @property
    def has_tool_part(self) -> bool:
        return bool(self.tool_calls) or self.call is not None

    @property
    def calls_only(self) -> bool:
        """A turn that only called tools: no text of its own to show (its calls show with their results)."""
        return bool(self.tool_calls) and not self.content

    def as_message(self) -> Message:
        """What the model is sent for this message (a tool result with the call it answers)."""
        if self.call is not None:
            return Message(self.role, self.content, tool_call_id=self.call.id, name=self.call.name)
        return Message(self.role, self.content, tool_calls=self.tool_calls)

    @classmethod
    def from_message(cls, m: Message, calls: dict[str, ToolCall] | None = None, **kw) -> "MessageRecord":
        """A record of a message sent to the model; a tool result's call is looked up in `calls`
        (by id: the calls of the turns before it), else it has the name only."""
        call = None
        if m.role == "tool":
            call = (calls or {}).get(m.tool_call_id or "") or ToolCall(m.tool_call_id or "", m.name or "", "")
        return cls(m.role, m.content, tool_calls=m.tool_calls, call=call, **kw)

    @classmethod
    def from_messages(cls, messages, **kw) -> list["MessageRecord"]:
        """Records of a conversation sent to the model (an API caller's history), each tool
        result with the call it answers; how long a tool ran is not known (the caller ran it)."""
        calls = {c.id: c for m in messages for c in m.tool_calls}
        return [cls.from_message(m, calls, duration_s=None, **kw) if m.role == "tool"
                else cls.from_message(m, **kw) for m in messages]

    @property
    def answers(self) -> list[str]:
        """Every answer of this reply in order, the shown one in its place."""
        return self.others[:self.shown] + [self.content] + self.others[self.shown:]

    def show_answer(self, index: int) -> None:
        everything = self.answers
        self.content, self.shown = everything[index], index
        self.others = everything[:index] + everything[index + 1:]


NOT_RUN = "not run: the agent was stopped before this call ran"


def answered(messages: Sequence[Message]) -> tuple[Message, ...]:
    """`messages` with a result for every call: a call left without one (the agent was stopped,
    or the app ended, while its tools ran) is answered NOT_RUN right after its turn's results.
    OpenAI-compatible servers refuse a history with a call left unanswered."""
    out: list[Message] = []
    waiting: list[ToolCall] = []  # the last assistant turn's calls not answered yet
    for m in messages:
        if m.role == "tool":
            waiting = [c for c in waiting if c.id != m.tool_call_id]
        else:
            out += [Message("tool", NOT_RUN, tool_call_id=c.id, name=c.name) for c in waiting]
            waiting = list(m.tool_calls)
        out.append(m)
    out += [Message("tool", NOT_RUN, tool_call_id=c.id, name=c.name) for c in waiting]
    return tuple(out)


def take_sent_results(records: list[MessageRecord], messages: Sequence[Message]) -> list[MessageRecord]:
    """A request's tool results as the model is sent them (the agent loop cuts one that does not
    fit the context) become their records' text, so what is saved and sent again later is what
    the model saw; returns the records changed."""
    sent = {m.tool_call_id: m.content for m in messages if m.role == "tool" and m.tool_call_id}
    changed = []
    for r in records:
        if r.call is not None and r.call.id in sent and sent[r.call.id] != r.content:
            r.content = sent[r.call.id]
            changed.append(r)
    return changed


@dataclass
class PaneRecord:
    id: str
    name: str
    role: str = "main"
    parent_id: str | None = None
    task: str | None = None
    position: int = 0
    messages: list[MessageRecord] = field(default_factory=list)
    settings: AgentSettings = AgentSettings()
    queued: list[str] = field(default_factory=list)  # typed while it replied, not sent yet
