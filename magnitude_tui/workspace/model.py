"""Provides WorkspaceModel: the workspace without its widgets. It keeps the panes by session,
which sessions' KV the current worker holds, the turn and queue rules (turns.py), the
conversations (conversations.py) and every store write; it talks back to its screen only through
WorkspaceHost."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Literal, Protocol

from magnitude_tui.agents import RoleBook
from magnitude_tui.engine.events import EngineFailed, EngineReady, RestoreOutcome, SeqUpdate, SessionRestored
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.store import PaneRecord, Store
from magnitude_tui.subagents import Subagents, next_name
from magnitude_tui.workspace.conversations import Conversations, with_role_tools
from magnitude_tui.workspace.limits import MAX_PANES
from magnitude_tui.workspace.turns import Turns
from scheduler.types import DoneReason, Phase, Priority, Request, SamplingParams

if TYPE_CHECKING:
    from magnitude_tui.widgets.chat_pane import ChatPane

Severity = Literal["information", "warning", "error"]

# A finished turn leaves its conversation's KV resident; so does a cancelled one (the engine keeps
# its committed rows). A fork of a session the engine no longer holds starts cold.
_KEEPS_KV = (DoneReason.STOP, DoneReason.LENGTH, DoneReason.CANCELLED)


class WorkspaceHost(Protocol):
    """What the model asks of its screen: panes on the grid, words to the user, the agents that
    run in panes, and the screen's own actions (export, copy) that a slash command names."""

    def notify(self, message: str, *, title: str = "", severity: Severity = "information",
               timeout: float | None = None, markup: bool = False) -> None: ...
    def grid_panes(self) -> list[ChatPane]: ...
    def focused_pane(self) -> ChatPane | None: ...
    def focus_pane(self, pane: ChatPane) -> None: ...
    def make_pane(self, record: PaneRecord, parent_name: str | None) -> ChatPane: ...
    async def mount_pane(self, pane: ChatPane, *, focus: bool) -> None: ...
    async def unmount_pane(self, pane: ChatPane) -> None: ...
    def perform(self, action: str) -> None: ...
    def agent_running(self, pane: ChatPane) -> bool: ...
    def stop_agent(self, pane: ChatPane) -> bool: ...
    async def start_agent(self, pane: ChatPane, task: str, role: str | None = None) -> None: ...


class WorkspaceModel:
    """The screen owns one; its actions and the engine's updates come here."""

    def __init__(self, host: WorkspaceHost, *, client: EngineClient, store: Store, roles: RoleBook,
                 sampling: SamplingParams | None = None) -> None:
        self.host = host
        self.client = client
        self.store = store
        self.role_book = roles
        self.sampling = sampling or SamplingParams()
        self.panes: dict[str, ChatPane] = {}  # open panes; outlives the DOM at shutdown, for save()
        self.ready = False
        self.policy = ""  # the engine's, from EngineReady and PolicyChanged
        self.n_ctx_seq: int | None = None  # tokens one sequence can hold (from EngineReady)
        self.warm: dict[str, SessionRestored] = {}  # the engine's answer about each pane's saved KV
        self._resident: set[str] = set()  # sessions whose KV the current worker holds
        self.subagents = Subagents(self, store, roles)
        self.turns = Turns(self)
        self.conversations = Conversations(self)

    @property
    def roles(self):
        """The agent definitions as the file says now (it is read again when it changed)."""
        return self.role_book.roles

    # ---- panes ------------------------------------------------------------------------------

    def pane_count(self) -> int:
        return len(self.host.grid_panes())

    @property
    def is_full(self) -> bool:
        return self.pane_count() >= MAX_PANES

    def find_pane(self, session_id: str) -> ChatPane | None:
        """The pane on the grid (mounted) that shows `session_id`."""
        return next((p for p in self.host.grid_panes() if p.session_id == session_id), None)

    def warn(self, message: str) -> None:
        self.host.notify(message, severity="warning")

    async def add_pane(self, pane: ChatPane, *, focus: bool = True) -> None:
        """Route the pane's session to it and mount it on the grid."""
        self.panes[pane.session_id] = pane
        pane.replies.context_size = self.n_ctx_seq
        await self.host.mount_pane(pane, focus=focus)

    async def open_record(self, record: PaneRecord, *, parent_name: str | None = None,
                          focus: bool = False) -> ChatPane:
        """A pane for a stored (or just stored) conversation, mounted (with its role's tools as
        the agents file says them now; the stored ones for a role it no longer has)."""
        record.settings = with_role_tools(record.settings, self.roles)
        pane = self.host.make_pane(record, parent_name)
        await self.add_pane(pane, focus=focus)
        return pane

    def open_pane(self, pane: ChatPane) -> asyncio.Future:
        """Route the pane's updates from now on and mount it soon (for callers outside a handler,
        whose request may produce updates before the mount is done)."""
        self.panes[pane.session_id] = pane
        pane.replies.context_size = self.n_ctx_seq
        self.store.add_pane(pane.record)
        return asyncio.ensure_future(self.host.mount_pane(pane, focus=False))

    async def new_pane(self) -> ChatPane | None:
        if self.is_full:
            self.warn(f"At most {MAX_PANES} panes")
            return None
        record = PaneRecord(uuid.uuid4().hex[:12], next_name("A", set(self.store.pane_names())),
                            position=self.pane_count())
        self.store.add_pane(record)
        return await self.open_record(record, focus=True)

    async def close_pane(self, pane: ChatPane, *, replace: bool = True) -> None:
        """Close a pane now: cancel its reply, free its sequence and KV, keep it in the store
        (`replace`: the last pane closed gives way to a new empty one). An agent running in it
        stops (its turn, tool or approval question): it would go on asking and acting for a pane
        no longer there."""
        self.host.stop_agent(pane)
        if pane.replies.request_id is not None:
            self.client.cancel(pane.replies.request_id)
        self.release_session(pane)
        self.save_pane(pane)
        self.store.close_pane(pane.session_id)
        self.panes.pop(pane.session_id, None)
        await self.host.unmount_pane(pane)
        self.keep_positions()
        if replace and not self.host.grid_panes():
            await self.new_pane()

    def keep_positions(self) -> None:
        self.store.set_positions([p.session_id for p in self.host.grid_panes()])

    def forget_saved(self, session_id: str) -> None:
        """The conversation is deleted: so is the KV the engine saved for it (the engine's command)."""
        self.client.forget(session_id)

    # ---- turns --------------------------------------------------------------------------------

    def submit_turn(self, pane: ChatPane, *, fork_from: str | None = None,
                    priority: Priority = Priority.INTERACTIVE) -> None:
        """Send the pane's conversation as a new request; it forks `fork_from`'s KV when the
        current worker holds it (else the engine prefills it cold). A person's turn is
        interactive; spawned subagents pass their own class."""
        request_id = f"{pane.session_id}:{uuid.uuid4().hex[:8]}"
        pane.begin_request(request_id)
        sampling = pane.record.settings.sampling(self.sampling)
        self.client.submit(Request(request_id, pane.session_id, pane.conversation(), sampling,
                                   fork_from=self.fork_source(fork_from), priority=priority,
                                   prompt=pane.raw_prompt()))

    def release_session(self, pane: ChatPane) -> None:
        """Give the pane's KV back to the pool (its next turn prefills again)."""
        self.client.close_session(pane.session_id)
        self.forget(pane.session_id)

    def fork_source(self, session_id: str | None) -> str | None:
        """`session_id` if the current worker holds its KV (a fork can share it), else None."""
        return session_id if session_id in self._resident else None

    def forget(self, session_id: str) -> None:
        """The session's KV went back to the pool."""
        self._resident.discard(session_id)

    def restore_sessions(self, panes: list[ChatPane]) -> None:
        """Warm resume: ask the engine to bring back each conversation's saved KV, so that its next
        reply prefills only the new turn (the engine answers SessionRestored)."""
        for pane in panes:
            if pane.record.messages and not pane.busy:
                self.client.restore_session(pane.session_id, pane.conversation())

    # ---- what the engine said (state only; the screen shows it) ------------------------------

    def route(self, update: SeqUpdate) -> ChatPane | None:
        """One update to its pane (None: no pane shows that session)."""
        pane = self.panes.get(update.session_id)
        if pane is None:
            return None
        pane.apply(update)
        if update.phase is Phase.DONE and update.done_reason in _KEEPS_KV:
            self._resident.add(update.session_id)
        return pane

    def engine_ready(self, event: EngineReady) -> None:
        self.ready = True
        self._resident.clear()
        self.policy = event.policy
        self.n_ctx_seq = event.n_ctx  # one unified KV pool: a sequence may use all of it
        for pane in self.panes.values():
            pane.replies.context_size = event.n_ctx

    def engine_failed(self, event: EngineFailed) -> bool:
        """The engine stopped; True if it had been ready (a failure after the load)."""
        was_ready, self.ready = self.ready, False
        self._resident.clear()
        return was_ready

    def warm_answers(self, answers: list[SessionRestored]) -> list[str]:
        """The engine's answers about saved KV; returns the restored panes' names, with tokens."""
        for answer in answers:
            self.warm[answer.session_id] = answer
            if answer.outcome is RestoreOutcome.RESTORED:
                self._resident.add(answer.session_id)  # its subagents fork its restored KV
        return [f"{p.record.name} ({a.tokens:,} tokens)" for a in answers
                if a.outcome is RestoreOutcome.RESTORED and (p := self.panes.get(a.session_id))]

    # ---- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        """Hand every new or changed message to the store (runs on a timer and at exit)."""
        for pane in self.panes.values():
            self.save_pane(pane)

    def save_pane(self, pane: ChatPane) -> None:
        changed = pane.take_unsaved()
        existing = [m for m in changed if m.id is not None]
        for message in changed:
            if message.id is None:
                self.store.add_message(pane.session_id, message)
        self.store.save_messages(existing)

    def keep_queue(self, pane: ChatPane) -> None:
        """Queued messages are in the store at once: a crash or quit must not lose them."""
        self.store.set_queued(pane.session_id, pane.queued)
