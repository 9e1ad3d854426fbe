"""Provides subagents: panes spawned from a parent pane that fork its conversation, run a task
and post their answer back to the parent.

The workspace model owns one `Subagents` and hands it what it needs: the store and a
`SubagentHost`, the few workspace operations a spawn uses (count, find, open, submit, warn). Names are
`<parent>.<k>` (A1.1, A1.2…), the lowest number no open pane has.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol

from magnitude_tui.agents import RoleBook
from magnitude_tui.commands import BURST_DEFAULT
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.names import first_free
from magnitude_tui.store import MessageRecord, PaneRecord, Store
from magnitude_tui.workspace.limits import MAX_PANES
from scheduler.types import DoneReason, Priority

if TYPE_CHECKING:
    from magnitude_tui.widgets.chat_pane import ChatPane


@dataclass(frozen=True)
class SpawnSpec:
    count: int
    task: str
    role: str | None = None  # a role from agents.toml (None: the parent's settings)


class SubagentHost(Protocol):
    """The workspace operations a spawn uses."""

    def pane_count(self) -> int: ...

    def find_pane(self, session_id: str) -> ChatPane | None: ...
    async def open_record(self, record: PaneRecord, *, parent_name: str | None = None,
                          focus: bool = False) -> ChatPane: ...
    def submit_turn(self, pane: ChatPane, *, fork_from: str | None = None,
                    priority: Priority = Priority.INTERACTIVE) -> None: ...
    def warn(self, message: str) -> None: ...


def next_name(prefix: str, used: set[str]) -> str:
    """The name prefix+N with the lowest N (from 1) that `used` (the open panes' names) lacks: a
    closed or renamed pane's name is taken again by the next new pane."""
    return first_free(used, lambda n: f"{prefix}{n}")


def burst_tasks(count: int) -> list[str]:
    return [f"Perspective {i + 1} of {count}: give one short, distinct idea that moves this "
            "conversation forward." for i in range(count)]


def answer_message(child: PaneRecord, message: MessageRecord | None, update: SeqUpdate) -> MessageRecord:
    """What a finished subagent posts to its parent: its answer, or why there is none."""
    if message is not None and message.content and update.done_reason is not DoneReason.ERROR:
        content = f"Answer from subagent {child.name} (task: {child.task}):\n\n{message.content}"
    else:
        why = update.error or (update.done_reason.value if update.done_reason else "no answer")
        content = f"Subagent {child.name} (task: {child.task}) ended without an answer: {why}"
    return MessageRecord("user", content, author=child.name)


class Subagents:
    """Spawns subagent panes and posts each one's first answer back to its parent, exactly once."""

    def __init__(self, host: SubagentHost, store: Store, roles: RoleBook | None = None) -> None:
        self.host = host
        self.store = store
        self.role_book = roles or RoleBook(None, {})  # named agent definitions a spawn may ask for
        self.reported: set[str] = set()  # subagents whose answer already went back to the parent

    def restore(self, records: Iterable[PaneRecord]) -> None:
        """Panes reopened from the store: an answer already in a parent is not posted again."""
        for record in records:
            self.reported.update(m.author for m in record.messages if m.author)

    async def spawn(self, parent: ChatPane, spec: SpawnSpec, *, tasks: list[str] | None = None,
                    priority: Priority = Priority.AGENT) -> list[ChatPane]:
        """Open `spec.count` subagent panes that fork `parent`'s conversation and run their task
        (as many as the grid has room for, saying so when that is fewer).

        Each copies the parent's committed messages (marked inherited) plus its task; all are
        submitted back to back, forking the parent's KV, so the engine admits them in one step.
        """
        host = self.host
        settings = parent.record.settings
        if spec.role:
            roles = self.role_book.roles
            if spec.role not in roles:  # the file changed since the role was typed
                host.warn(self.role_book.unknown(spec.role))
                return []
            settings = roles[spec.role]
        free = MAX_PANES - host.pane_count()
        count = min(spec.count, free)
        if count < spec.count:
            host.warn(f"Asked for {spec.count} subagents; room for {count} more pane(s) (at most "
                      f"{MAX_PANES}), so {count} started")
        # The child sends its own system prompt (its role's, else the parent's) ahead of the
        # inherited messages; with the parent's, the prefix matches and the fork shares its KV.
        context = parent.conversation(committed_only=True, with_system=False)
        used = set(self.store.pane_names())
        children = []
        for i in range(count):
            name = next_name(f"{parent.record.name}.", used)
            used.add(name)
            task = tasks[i] if tasks else spec.task
            messages = MessageRecord.from_messages(context, inherited=True)
            messages.append(MessageRecord("user", f"You are subagent {name}. Your task: {task}"))
            record = PaneRecord(uuid.uuid4().hex[:12], name, "subagent", parent.session_id, task,
                                host.pane_count(), messages, settings)
            self.store.add_pane(record)
            children.append(await host.open_record(record, parent_name=parent.record.name))
        # Submitted together so the engine's idle coalescing admits the burst in one batch.
        for child in children:
            host.submit_turn(child, fork_from=parent.session_id, priority=priority)
        return children

    async def burst(self, parent: ChatPane, count: int = BURST_DEFAULT) -> list[ChatPane]:
        """`count` subagents with distinct perspectives, titled "k of n" for the n that fit."""
        fits = min(count, MAX_PANES - self.host.pane_count())
        return await self.spawn(parent, SpawnSpec(count, "burst"), tasks=burst_tasks(fits),
                                priority=Priority.BACKGROUND)

    async def reply_finished(self, event: ChatPane.ReplyFinished) -> bool:
        """A pane's reply ended: if it is a subagent's first, post the answer to the parent (and
        say so: True)."""
        child = event.pane
        if child.record.role != "subagent" or child.record.name in self.reported:
            return False
        self.reported.add(child.record.name)
        result = answer_message(child.record, event.message, event.update)
        parent = self.host.find_pane(child.record.parent_id or "")
        if parent is not None:
            await parent.add_message(result)  # held until the parent's own reply is done
        elif child.record.parent_id:
            self.store.add_message(child.record.parent_id, result)  # parent closed: keep it on record
        return True
