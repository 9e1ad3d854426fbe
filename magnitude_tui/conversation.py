"""Provides Conversation: a pane's records as a conversation, which of them the model is sent
(the engine leaves out the oldest when the context fills), an agent's tool turns, and which are
not saved yet. Plain data: the pane (widgets/chat_pane.py) shows it, the workspace saves it."""

from __future__ import annotations

from magnitude_tui.records import MessageRecord, PaneRecord, answered
from scheduler.types import Message, ToolCall


def _own(m: MessageRecord | None) -> bool:
    """The user's own message (not a subagent's answer, not context inherited at a spawn)."""
    return m is not None and m.role == "user" and not m.author and not m.inherited


class Conversation:
    """One pane's conversation: its records, what its next request sends from them, and the
    records created or changed since the workspace last saved."""

    def __init__(self, record: PaneRecord) -> None:
        self.record = record
        self._sent: list[MessageRecord] = []  # the records the current request carries, in order
        self._request_start = 0  # where the records the current (or last) request added begin
        self._dropped: set[int] = set()  # id() of records left out of the context (it was full)
        self._unsaved: dict[int, MessageRecord] = {}  # id(record) -> record, in creation order
        for m in record.messages:
            if m.role == "assistant" and not m.complete and m.done_reason is None:
                m.done_reason = "interrupted"  # cut off by a crash or kill; say so once restored
                self.mark_unsaved(m)

    @property
    def messages(self) -> list[MessageRecord]:
        return self.record.messages

    # ---- what the model is sent ---------------------------------------------------------------

    def in_context(self, leave_out: MessageRecord | None = None) -> list[MessageRecord]:
        """The records the next request sends, oldest first: not the empty ones, not those the
        engine left out when the context filled, not `leave_out` (a reply still streaming)."""
        return [m for m in self.messages
                if (m.content or m.has_tool_part) and id(m) not in self._dropped and m is not leave_out]

    def to_send(self, *, leave_out: MessageRecord | None = None, with_system: bool = True) -> tuple[Message, ...]:
        """The messages the next request sends: the system prompt, then the records in context,
        a call the agent never ran (it was stopped, the app ended) answered "not run"."""
        system = self.record.settings.system
        head = (Message("system", system),) if system and with_system else ()
        return head + answered([m.as_message() for m in self.in_context(leave_out)])

    def raw_text(self) -> str:
        """The records in context joined as they are (what a raw completion continues)."""
        return "".join(m.content for m in self.in_context())

    def begin_request(self) -> None:
        """A request starts from the records now in context (what a drop it reports counts from)."""
        self._sent = self.in_context()
        self._request_start = len(self.messages)

    def is_dropped(self, message: MessageRecord) -> bool:
        """Left out of the context when it filled up (no longer sent to the model)."""
        return id(message) in self._dropped

    def drop_oldest(self, count: int) -> str:
        """The engine left out the oldest `count` messages of the current request after the system
        ones: they are not sent again. Returns the note that says so."""
        # The pane's system prompt is sent ahead of these records and never dropped.
        first = 0
        while first < len(self._sent) and self._sent[first].role == "system":
            first += 1
        dropped = self._sent[first:first + count]
        self._dropped.update(id(m) for m in dropped)
        turns = sum(m.role == "user" for m in dropped)
        return (f"context full: the oldest {turns} turn{'s' * (turns != 1)} ({count} messages) no longer "
                "fit and are not sent to the model; the system prompt and the latest turns are kept")

    def too_long_note(self, dropped: int, prompt_tokens: int, context: int | None, *, local: bool) -> str | None:
        """The note for the current request refused as longer than the context when its prompt
        held the newest record alone (nothing came before it, or the engine left out, `dropped`,
        everything that did): that message cannot fit, and nothing was dropped. None otherwise
        (a longer conversation's refusal keeps the engine's own words)."""
        # An API caller's history reaches the pane after its request began (serve/panes.py): what
        # counts as sent here is not what the caller sent, and the caller is told anyway.
        if self.record.role == "api" or not self._sent or dropped < len(self._sent) - 1:
            return None
        with_system = " with the system prompt" if self.record.settings.system else ""
        size = f"{prompt_tokens:,} tokens{with_system}" if prompt_tokens else ""
        room = f"the context holds {context:,}" if context else ""
        sizes = "; ".join(part for part in (size, room) if part)
        return (f"not sent: this message does not fit the context even alone{f' ({sizes})' if sizes else ''}; "
                "shorten or split it, or use a larger context" + (" (--n-ctx)" if local else ""))

    # ---- records ------------------------------------------------------------------------------

    def append(self, message: MessageRecord) -> None:
        self.messages.append(message)
        self.mark_unsaved(message)

    def start_reply(self, carried: list[str]) -> MessageRecord:
        """The model's reply as it begins streaming; `carried`: the answers a retry replaced."""
        reply = MessageRecord("assistant", "", complete=False, others=carried, shown=len(carried))
        self.append(reply)
        return reply

    def truncate(self, message: MessageRecord, *, keep: bool) -> list[MessageRecord]:
        """Remove the records after `message` (and `message` itself unless `keep`); returns them."""
        index = next(i for i, m in enumerate(self.messages) if m is message) + int(keep)
        removed = self.messages[index:]
        del self.messages[index:]
        for m in removed:
            self._unsaved.pop(id(m), None)
        return removed

    def withdraw_last_prompt(self) -> MessageRecord | None:
        """Remove and return the last record if it is the user's own message (None otherwise)."""
        last = self.messages[-1] if self.messages else None
        if not _own(last):
            return None
        self.messages.pop()
        self._unsaved.pop(id(last), None)
        return last

    def last_prompt(self) -> MessageRecord | None:
        """The user's own latest message (not a subagent's answer, not inherited context)."""
        return next((m for m in reversed(self.messages) if _own(m)), None)

    def last_reply(self) -> MessageRecord | None:
        """The last record when it is the model's (what retry asks again and alt+left/right page)."""
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last.role == "assistant" else None

    def last_answer(self) -> str | None:
        return next((m.content for m in reversed(self.messages) if m.role == "assistant" and m.content), None)

    def unanswered_prompt(self) -> MessageRecord | None:
        """A main pane's last record when it is the user's own message (nothing answered it)."""
        last = self.messages[-1] if self.messages else None
        return last if _own(last) and self.record.role == "main" else None

    # ---- an agent's tool turns ----------------------------------------------------------------

    def add_tool_turn(self, calls: tuple[ToolCall, ...]) -> None:
        """The current request's turn called tools: they join its reply, or a reply of their own
        when the turn wrote no text."""
        reply = next((m for m in self.messages[self._request_start:]
                      if m.role == "assistant" and not m.author), None)
        if reply is None:
            reply = MessageRecord("assistant", "")
            self.messages.append(reply)
        reply.tool_calls = calls
        self.mark_unsaved(reply)

    # ---- saving -------------------------------------------------------------------------------

    def mark_unsaved(self, message: MessageRecord) -> None:
        self._unsaved.setdefault(id(message), message)

    def take_unsaved(self) -> list[MessageRecord]:
        """Records created or changed since the last call, oldest first (the workspace saves them)."""
        out = list(self._unsaved.values())
        self._unsaved.clear()
        return out
