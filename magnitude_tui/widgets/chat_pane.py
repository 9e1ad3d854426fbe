"""Provides a chat pane: title, streaming Markdown transcript, status line and composer."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.message import Message as TextualMessage
from textual.widget import Widget
from textual.widgets import Static

from magnitude_tui.agents import AgentSettings
from magnitude_tui.conversation import Conversation
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.pane_replies import Ending, PaneReplies, Reply
from magnitude_tui.records import MessageRecord, PaneRecord
from magnitude_tui.widgets.composer import Composer, typing_in
from magnitude_tui.widgets.format import visible
from magnitude_tui.widgets.message_view import MessageView
from magnitude_tui.widgets.pane_labels import gauge, pane_title, queue_note, speaker
from magnitude_tui.widgets.status_line import StatusLine
from magnitude_tui.widgets.tool_block import ToolActivity, ToolBlock
from magnitude_tui.widgets.tool_turn_view import ToolTurnView
from magnitude_tui.widgets.transcript import Transcript
from scheduler.types import Message


class ChatPane(Vertical):
    """One conversation (one engine session) on screen: it shows the transcript of its
    Conversation (`chat`) and paints what its PaneReplies (`replies`) make of the engine's
    updates as replies stream; the app talks to the engine."""

    BINDINGS = [
        # Priority: the composer (a TextArea) has focus nearly always and would take them for
        # its own cursor, so the transcript never scrolled from the keyboard.
        Binding("pageup", "scroll_transcript(-1)", "Scroll up", show=False, priority=True),
        Binding("pagedown", "scroll_transcript(1)", "Scroll down", show=False, priority=True),
    ]

    @dataclass
    class Submitted(TextualMessage):
        """The user pressed Enter in the composer."""

        pane: "ChatPane"
        text: str
        editing: MessageRecord | None = None  # the message this text replaces (Up, then Enter)

    @dataclass
    class ReplyFinished(TextualMessage):
        """A reply reached `done`; its text is final (and on screen)."""

        pane: "ChatPane"
        message: MessageRecord | None  # None when the request ended before any text
        update: SeqUpdate

    def __init__(self, record: PaneRecord, *, parent_name: str | None = None) -> None:
        super().__init__(id=f"pane-{record.id}")
        self.record = record
        self.chat = Conversation(record)  # what is sent, dropped, not saved yet
        # The running request, what its updates made and what waits for the next paint.
        self.replies: PaneReplies[Widget] = PaneReplies(self.chat)
        self.parent_name = parent_name
        self._views: dict[Reply, MessageView] = {}  # the replies painted, until their ending settles
        self._status_dirty = True
        # Typed while a reply streamed; sent one turn each, in order (kept in the store meanwhile).
        self.queued: list[str] = list(record.queued)
        self.editing: MessageRecord | None = None  # the message the composer holds for a resend
        self._gauge = ""
        self.composer = Composer()  # held: the paint tick reads it even while the pane is torn down
        # Raw completion (/raw): the transcript's text is continued as is, without the chat
        # template, for base models that have none (the engine is told with Request.prompt).
        self.raw = False
        self.activity: ToolActivity | None = None  # an agent's tool or approval this pane waits on
        self._retitle()

    # ---- what the app reads -------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.record.id

    @property
    def title(self) -> str:
        return pane_title(self.record, self.parent_name, raw=self.raw)

    def _retitle(self) -> None:
        # As plain text: the title holds what the user typed (the first message, a rename) and a
        # title set as a str is read as markup: "[/b]" in it raised MarkupError and ended the app.
        self.border_title = Content(visible(self.title))

    @property
    def busy(self) -> bool:
        return self.replies.busy

    @property
    def has_ended(self) -> bool:
        """A reply ended and its ending is not painted and settled yet (the next flush does it)."""
        return self.replies.has_ended

    def conversation(self, *, committed_only: bool = False, with_system: bool = True) -> tuple[Message, ...]:
        """The messages the next turn sends (the engine reuses whatever prefix it still holds):
        the pane's system prompt, then its messages.

        `committed_only` leaves out a reply that is still streaming (what a spawned subagent forks).
        Messages dropped when the context filled up are not sent again.
        """
        reply = self.replies.streaming
        streaming = reply.message if committed_only and reply is not None else None
        return self.chat.to_send(leave_out=streaming, with_system=with_system)

    def raw_prompt(self) -> str | None:
        """In raw mode, the text the next turn continues: the transcript's messages joined as
        they are (no roles, no system prompt); None in chat mode."""
        return self.chat.raw_text() if self.raw else None

    def set_raw(self, raw: bool) -> None:
        self.raw = raw
        self._retitle()

    def apply_settings(self, settings: AgentSettings) -> None:
        """New system prompt and sampling: they apply from the next turn on."""
        self.record.settings = settings
        self._retitle()

    def gauge_text(self) -> str:
        """The context gauge in the pane's bottom border (pane_labels.gauge)."""
        r = self.replies
        endpoint = r.last_update.remote.endpoint if r.last_update is not None else None
        return gauge(r.context_used, r.context_size, endpoint, width=self.size.width)

    def last_reply(self) -> MessageRecord | None:
        """The latest message of the model (what retry asks again and alt+left/right page)."""
        return self.chat.last_reply()

    async def show_answer(self, message: MessageRecord, index: int) -> None:
        """Show (and send from now on) answer `index` of a reply that retry gave several."""
        message.show_answer(index)
        self.chat.mark_unsaved(message)
        for view in self._shown_views():
            if view.message is message:
                await view.redraw()

    def last_answer(self) -> str | None:
        return self.chat.last_answer()

    def toggle_tool_details(self) -> int:
        """Unfold every tool block shown (f8), or fold them all when all are unfolded; how many."""
        blocks = list(self.query(ToolBlock))
        unfold = not all(b.unfolded for b in blocks)
        for block in blocks:
            if block.unfolded != unfold:
                block.action_unfold()
        return len(blocks)

    def is_streaming(self, message: MessageRecord) -> bool:
        return self.replies.is_streaming(message)

    def is_dropped(self, message: MessageRecord) -> bool:
        """Left out of the context when it filled up (no longer sent to the model)."""
        return self.chat.is_dropped(message)

    def take_unsaved(self) -> list[MessageRecord]:
        """Messages created or changed since the last call, oldest first (the app persists them)."""
        return self.chat.take_unsaved()

    # ---- layout -------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        inherited = sum(m.inherited for m in self.record.messages)
        fork_note = (f"forked from {self.parent_name or 'a closed pane'} with {inherited} messages of "
                     "shared context") if inherited else None
        yield Transcript(self.record.messages, self._view, fork_note)
        yield Static("", classes="queued-note", markup=False)
        yield StatusLine()
        yield self.composer

    def on_mount(self) -> None:
        self._show_note()

    def on_resize(self) -> None:
        self._status_dirty = True  # the gauge's form follows the pane's width (next paint)

    def _view(self, m: MessageRecord) -> MessageView:
        view = (ToolTurnView(m, speaker=self._speaker(m)) if m.call is not None or m.calls_only
                else MessageView(m, speaker=self._speaker(m)))
        view.set_class(self.chat.is_dropped(m), "-dropped")
        return view

    def _transcript(self) -> Transcript | None:
        """None before compose and while the pane is torn down. A child of the pane: looked up
        among the children only (a long transcript holds thousands of widgets, and the paint tick
        asks for it)."""
        found = self.query_children(Transcript)
        return found.first() if found else None

    def _shown_views(self) -> list[MessageView]:
        """The message views shown (the transcript's children; none before compose)."""
        transcript = self._transcript()
        return transcript.views() if transcript is not None else []

    def _speaker(self, m: MessageRecord) -> str:
        return speaker(self.record, self.parent_name, m)

    def rename(self, name: str) -> None:
        self.record.name = name
        self._retitle()
        self._rename_speakers()

    def set_parent_name(self, name: str) -> None:
        """The parent pane was renamed: the title and the headers that name it follow."""
        self.parent_name = name
        self._retitle()
        self._rename_speakers()

    def _rename_speakers(self) -> None:
        for view in self._shown_views():
            view.set_speaker(self._speaker(view.message))

    def focus_composer(self) -> None:
        # At once, not on the next message-loop turn as Widget.focus() does: keys that arrived in
        # the same burst as a pane switch are forwarded to whatever has focus when each is read.
        if self.composer.is_attached:
            self.screen.set_focus(self.composer)
        else:
            self.composer.focus()

    async def action_scroll_transcript(self, direction: int) -> None:
        t = self.query_one(Transcript)
        if direction < 0 and t.scroll_y <= 0 and t.hidden:
            await t.show_earlier()  # at the top: the messages before it come in above
        else:
            t.scroll_page_down() if direction > 0 else t.scroll_page_up()

    @on(Composer.Submitted)
    def _composer_submitted(self, event: Composer.Submitted) -> None:
        event.stop()
        editing, self.editing = self.editing, None
        self.post_message(self.Submitted(self, event.text, editing))
        self._show_note()

    # ---- messages typed while a reply streams --------------------------------------------------

    def queue(self, text: str) -> None:
        """Hold a message until the running reply ends (then it is the next turn)."""
        self.queued.append(text)
        self._show_note()

    def next_queued(self) -> str | None:
        text = self.queued.pop(0) if self.queued else None
        self._show_note()
        return text

    def return_to_composer(self, texts: list[str]) -> None:
        """Put messages back into the composer, before whatever is being typed there now."""
        parts = [t for t in [*texts, self.composer.text] if t.strip()]
        self.composer.value = "\n\n".join(parts)

    def _show_note(self) -> None:
        text = queue_note(self.queued, self.editing is not None)
        for note in self.query_children(".queued-note").results(Static):
            note.display = bool(text)
            if text:
                note.update(text)

    # ---- editing and retrying -----------------------------------------------------------------

    def last_prompt(self) -> MessageRecord | None:
        """The user's own latest message (not a subagent's answer, not inherited context)."""
        return self.chat.last_prompt()

    def start_editing(self, message: MessageRecord) -> None:
        self.editing = message
        self.composer.value = message.content
        self._show_note()

    @on(Composer.Changed)
    def _composer_changed(self, event: Composer.Changed) -> None:
        if self.editing is not None and not self.composer.text:
            self.editing = None
            self._show_note()

    async def truncate(self, message: MessageRecord, *, keep: bool) -> list[MessageRecord]:
        """Remove the messages after `message` (and `message` itself unless `keep`) from the
        transcript; returns what was removed (the caller deletes it from the store)."""
        removed = self.chat.truncate(message, keep=keep)
        gone = {id(m) for m in removed}
        for view in self._shown_views():
            if id(view.message) in gone:
                await view.remove()
        transcript = self._transcript()
        if transcript is not None:
            await transcript.refill()
        self.editing = None
        self._show_note()
        self._retitle()
        return removed

    # ---- conversation -------------------------------------------------------------------------

    async def add_message(self, message: MessageRecord) -> None:
        """Append a finished message; a subagent's answer waits until the running reply is done."""
        if self.replies.hold(message):
            return
        self.chat.append(message)
        self._retitle()  # the first message names the conversation
        transcript = self._transcript()
        if transcript is not None:
            await transcript.add(self._view(message))

    async def withdraw_last_prompt(self) -> MessageRecord | None:
        """Take back the last message if it is the user's own and unanswered (None otherwise)."""
        last = None if self.busy else self.chat.withdraw_last_prompt()
        if last is None:
            return None
        for view in self._shown_views():
            if view.message is last:
                await view.remove()
        transcript = self._transcript()
        if transcript is not None:
            await transcript.refill()
        self._retitle()
        return last

    def begin_request(self, request_id: str) -> None:
        self.replies.begin_request(request_id)
        self._status_dirty = True

    def apply(self, update: SeqUpdate) -> None:
        """Take one engine update for this pane's request (cheap: rendering happens in flush)."""
        if self.replies.apply(update):
            self._status_dirty = True

    async def flush(self) -> None:
        """Paint buffered text (finished replies first), the latest status, and settle endings.

        The workspace calls this on its paint tick; tokens are only buffered in between."""
        ended, notes_after = self.replies.take()
        for notes, ending in ended:
            await self._paint_notes(notes)  # a late tick keeps their order
            if ending.reply is not None:
                await self._paint(ending.reply)
            await self._settle(ending)
        await self._paint_notes(notes_after)
        if self.replies.streaming is not None:
            await self._paint(self.replies.streaming)
        if self._status_dirty or self.activity is not None:  # the tool phase's clock runs
            self._status_dirty = False
            for status in self.query_children(StatusLine):  # none while the pane is torn down
                status.show(self.replies.last_update, self.activity)
            gauge = self.gauge_text()
            if gauge and gauge != self._gauge:  # a new request keeps the last gauge until it knows
                self._gauge = self.border_subtitle = gauge
        if ended:
            for message in self.replies.take_held():
                await self.add_message(message)

    async def _paint(self, reply: Reply) -> None:
        text = reply.take_text()
        if not text:
            return
        view = self._views.get(reply)
        if view is None:
            transcript = self._transcript()
            if transcript is None:  # the pane is being torn down (the app is closing)
                return
            view = self._views[reply] = MessageView(reply.message, speaker=self._speaker(reply.message),
                                                    streaming=True)
            await transcript.add(view)
        # While keys come, finished blocks wait in the open text: mounting them as Markdown lays
        # out the screen several frames in a row, and a typed key's frame would wait for that.
        await view.write(text, settle=not (self.is_attached and typing_in(self.screen)))

    async def _settle(self, ending: Ending) -> None:
        reply, note = ending.reply, ending.error_note
        view = self._views.pop(reply, None) if reply is not None else None
        if view is not None:
            await view.finish(note)
        elif note and not ending.told:
            self.notify(f"{self.record.name}: {note}", severity="error", markup=False)
        self.post_message(self.ReplyFinished(self, reply.message if reply else None, ending.update))

    def set_activity(self, activity: ToolActivity | None) -> None:
        """An agent's tool phase (shown on the next paint instead of the last request's phase)."""
        self.activity = activity
        self._status_dirty = True

    def add_tool_result(self, record: MessageRecord, panes: tuple[str, ...] = ()) -> None:
        """A tool's result: kept with the conversation, and shown as its call's block after the
        text painted before it (on the next paint). `panes`: the panes spawn_agents' subagents ran in."""
        self.chat.append(record)
        self.replies.note(ToolTurnView(record, speaker=self._speaker(record), panes=panes))

    async def _paint_notes(self, notes: list[str | Widget]) -> None:
        transcript = self._transcript() if notes else None
        if transcript is None:
            return
        for view in transcript.views():
            view.set_class(self.chat.is_dropped(view.message), "-dropped")
        for note in notes:
            await (transcript.mount(note) if isinstance(note, Widget) else transcript.add_note(note))
