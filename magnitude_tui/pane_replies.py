"""Provides PaneReplies: a pane's requests as the engine reports them, turned into records. It
decides which reply is streaming and what of it is not painted yet, which requests ended and how,
and the notes the transcript shows between them; the pane (widgets/chat_pane.py) paints what it
holds. Plain data, no widgets: tests drive it with SeqUpdates alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from magnitude_tui.conversation import Conversation
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.records import MessageRecord
from magnitude_tui.widgets.paint_queue import PaintQueue
from scheduler.types import DoneReason, ErrorKind, Phase

Block = TypeVar("Block")  # what else the pane paints in its transcript between notes (a tool block)


@dataclass(eq=False)  # by identity: the pane keys the view it paints a reply into by it
class Reply:
    """An assistant reply and the text of it not painted yet."""

    message: MessageRecord
    pending: list[str] = field(default_factory=list)

    def take_text(self) -> str:
        """The text that came since the last call (what the next paint writes)."""
        text = "".join(self.pending)
        self.pending.clear()
        return text


@dataclass
class Ending:
    """A request that ended, waiting for the paint tick: its reply (None: no text came), its last
    update, and whether the transcript already says why it failed (then no toast says it too)."""

    reply: Reply | None
    update: SeqUpdate
    told: bool = False

    @property
    def error_note(self) -> str | None:
        """Why the request failed, in the words the reply's end or a toast shows (None: it did not)."""
        u = self.update
        return f"{u.done_reason.value if u.done_reason else 'error'}: {u.error}" if u.error else None


class PaneReplies(Generic[Block]):
    """One pane's request at a time: engine updates for it become its reply record (in `chat`,
    the Conversation the pane shows), and what it ended with, the notes, and the subagents'
    answers held meanwhile wait in order for the pane's next paint."""

    def __init__(self, chat: Conversation) -> None:
        self.chat = chat
        self.request_id: str | None = None
        self.last_update: SeqUpdate | None = None
        self.streaming: Reply | None = None  # the reply of the running request, once text came
        # The answers a retry replaced: the next reply keeps them as its others (paged ‹k/n›).
        self.carried: list[str] = []
        self.context_size: int | None = None  # tokens one sequence holds (from EngineReady)
        # Requests that ended and notes (context notes, tool blocks), in the order they came.
        self._waiting: PaintQueue[Ending, str | Block] = PaintQueue()
        self._held: list[MessageRecord] = []  # subagents' answers that came while a reply ran

    @property
    def busy(self) -> bool:
        return self.request_id is not None

    @property
    def has_ended(self) -> bool:
        """A request ended and its ending is not painted and settled yet (the next take has it)."""
        return self._waiting.has_endings

    @property
    def context_used(self) -> int | None:
        """Tokens the conversation holds in its sequence after the latest request (None: unknown)."""
        u = self.last_update
        return u.prompt_total + u.generated if u is not None and u.prompt_total else None

    def is_streaming(self, message: MessageRecord) -> bool:
        return self.streaming is not None and message is self.streaming.message

    def unanswered_prompt(self) -> MessageRecord | None:
        """The user's own last message when nothing answered it (the app ended before its reply
        began), else None."""
        return None if self.busy else self.chat.unanswered_prompt()

    # ---- the engine's updates -------------------------------------------------------------------

    def begin_request(self, request_id: str) -> None:
        self.chat.begin_request()
        self.request_id = request_id
        self.last_update = None

    def apply(self, update: SeqUpdate) -> bool:
        """Take one engine update for the running request; False when it is for another (a late
        update for a request the pane already gave up on), which changes nothing.

        The records are final as soon as `done` arrives; only their painting waits for the next
        take, so a new request can start at once without touching the finished reply.
        """
        if update.request_id != self.request_id:
            return False
        # A request refused before it ran dropped nothing (the next one is fitted afresh): its
        # prompt did not fit even trimmed, or failed otherwise before the drop was reported.
        refused = update.phase is Phase.DONE and update.error is not None
        if (update.dropped_messages and not refused
                and not (self.last_update and self.last_update.dropped_messages)):
            self._waiting.note(self.chat.drop_oldest(update.dropped_messages))
        self.last_update = update
        if update.text_delta:
            if self.streaming is None:
                carried, self.carried = self.carried, []
                self.streaming = Reply(self.chat.start_reply(carried))
            self.streaming.message.content += update.text_delta
            self.streaming.pending.append(update.text_delta)
            self.chat.mark_unsaved(self.streaming.message)
        if update.phase is Phase.DONE:
            self.request_id = None
            reply, self.streaming = self.streaming, None
            if reply is not None:
                reply.message.complete = True
                reply.message.done_reason = (update.done_reason or DoneReason.STOP).value
                self.chat.mark_unsaved(reply.message)
            too_long = self._too_long(update) if reply is None else None
            if too_long is not None:
                self._waiting.note(too_long)
            self._waiting.end(Ending(reply, update, told=too_long is not None))
        return True

    def _too_long(self, update: SeqUpdate) -> str | None:
        """The note for a prompt refused as longer than the context, when its message alone was."""
        if update.error_kind is not ErrorKind.CONTEXT_LENGTH:
            return None
        return self.chat.too_long_note(update.dropped_messages, update.prompt_total, self.context_size,
                                       local=update.remote.endpoint is None)

    # ---- what the next paint shows --------------------------------------------------------------

    def note(self, note: str | Block) -> None:
        """A line (or block) for the reader at the end of the transcript, after the requests that
        ended before it, not a message."""
        self._waiting.note(note)

    def take(self) -> tuple[list[tuple[list[str | Block], Ending]], list[str | Block]]:
        """Everything waiting for the paint, emptied: each ending with the notes that came just
        before it, then the notes that came after the last one (PaintQueue.take)."""
        return self._waiting.take()

    def hold(self, message: MessageRecord) -> bool:
        """Keep a subagent's answer back while a reply runs or waits for its paint, so that it
        follows that reply; True when it was held."""
        if message.author and (self.busy or self.has_ended):
            self._held.append(message)
            return True
        return False

    def take_held(self) -> list[MessageRecord]:
        """The answers held back, emptied, once no request runs or waits for its paint (else none)."""
        if self.busy or self.has_ended:
            return []
        held, self._held = self._held, []
        return held
