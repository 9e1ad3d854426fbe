"""Provides what happens to whole conversations: closing, opening and reopening (one pane or a
whole workspace), renaming, deleting, and a pane's agent settings. The screen runs the dialogs
that ask for these (screens/workspace_dialogs.py) and hands the answers here."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Mapping

from magnitude_tui.agents import AgentSettings
from magnitude_tui.names import first_free
from magnitude_tui.workspace.limits import MAX_PANES

if TYPE_CHECKING:
    from magnitude_tui.widgets.chat_pane import ChatPane
    from magnitude_tui.workspace.model import WorkspaceModel


def free_name(name: str, taken: set[str]) -> str:
    """`name` if no open pane has it, else the first free of `name (2)`, `name (3)`..."""
    return first_free(taken, lambda k: name if k == 1 else f"{name} ({k})")


def untouched(pane: ChatPane) -> bool:
    """Nothing in it: no message, nothing queued or typed, no reply running (closing loses nothing)."""
    return not (pane.record.messages or pane.queued or pane.busy or pane.composer.text.strip())


def with_role_tools(settings: AgentSettings, roles: Mapping[str, AgentSettings],
                    before: AgentSettings | None = None) -> AgentSettings:
    """`settings` with its role's agent keys (tools, approve, tool_choice) as the agents file says
    them now. The agent dialog (f6) edits only the role, system prompt and sampling: without this
    a pane saved there, of a read-only role with tools, ran its messages as plain chat, and
    `/agent` in it was offered every tool. A role the file no longer has keeps what the pane had
    (`before`, when it is the same role; on reopen, what the store kept)."""
    role = roles.get(settings.role) if settings.role else None
    if role is None:
        role = before if before is not None and before.role == settings.role else None
    if role is None:
        return settings
    return replace(settings, tools=role.tools, approve=role.approve, tool_choice=role.tool_choice)


def host_children(model: WorkspaceModel, pane_id: str) -> list[ChatPane]:
    """The open panes spawned from `pane_id`."""
    return [p for p in model.panes.values() if p.record.parent_id == pane_id]


class Conversations:
    """The workspace model owns one."""

    def __init__(self, model: WorkspaceModel) -> None:
        self.model = model
        self.host = model.host

    async def close(self, pane: ChatPane) -> None:
        name = pane.record.name
        await self.model.close_pane(pane)
        self.host.notify(f"Closed {name} · f4 lists conversations to reopen it", timeout=4)

    async def open(self, pane_id: str) -> ChatPane | None:
        """Focus the conversation's pane, reopening it (from any workspace) when it is closed."""
        model, host, store = self.model, self.host, self.model.store
        pane = model.find_pane(pane_id)
        if pane is None:
            if model.is_full:
                host.notify(f"At most {MAX_PANES} panes; close one first", severity="warning")
                return None
            taken = set(store.pane_names())
            record = store.reopen_pane(pane_id, model.pane_count())
            holder = next((p for p in host.grid_panes() if p.record.name == record.name), None)
            if holder is not None and untouched(holder) and host.grid_panes() == [holder]:
                # The grid holds only an empty pane with the name (the one a launch opens, or
                # that closing the last pane opened): it gives way, as for a whole workspace,
                # and the reopened conversation keeps its name instead of becoming "A1 (2)".
                await model.close_pane(holder, replace=False)
                store.delete_pane(holder.session_id)
                taken.discard(record.name)
            if record.name in taken:  # a new pane took the name while this one was closed
                old, record.name = record.name, free_name(record.name, taken)
                store.rename_pane(record.id, record.name)
                host.notify(f"{old} is open already; the reopened conversation is {record.name}", timeout=5)
            parent = model.find_pane(record.parent_id or "")
            model.subagents.restore([record])
            pane = await model.open_record(record, parent_name=parent.record.name if parent else None)
            model.keep_positions()
            model.restore_sessions([pane])
            await model.turns.send_restored_queue([pane])
        host.focus_pane(pane)
        return pane

    async def open_workspace(self, workspace_id: int) -> list[ChatPane]:
        """Reopen every pane that was open when workspace `workspace_id` was last used, in its
        order; the untouched empty panes here give way to them (a fresh launch opens one)."""
        model, host = self.model, self.host
        wanted = [i for i in model.store.workspace_panes(workspace_id) if model.find_pane(i) is None]
        if not wanted:
            host.notify("Every conversation of that workspace is open already", timeout=4)
            return []
        for pane in [p for p in host.grid_panes() if untouched(p)]:
            await model.close_pane(pane, replace=False)
            model.store.delete_pane(pane.session_id)  # nothing in it worth listing in f4
        opened: list[ChatPane] = []
        for pane_id in wanted:
            reopened = await self.open(pane_id)
            if reopened is None:  # the grid is full (open() said so)
                break
            opened.append(reopened)
        if not host.grid_panes():
            await model.new_pane()
        elif opened:
            host.focus_pane(opened[0])
        return opened

    def set_settings(self, pane: ChatPane, settings: AgentSettings) -> None:
        """The pane's role, system prompt and sampling, from its next turn on."""
        settings = with_role_tools(settings, self.model.roles, before=pane.record.settings)
        pane.apply_settings(settings)
        self.model.store.set_pane_settings(pane.session_id, settings)

    def rename(self, pane_id: str, name: str) -> None:
        model = self.model
        pane = model.find_pane(pane_id)
        if pane is not None and name != pane.record.name and name in model.store.pane_names():
            self.host.notify(f"{name} is already taken in this workspace", severity="warning")
            return
        model.store.rename_pane(pane_id, name)
        if pane is not None:
            pane.rename(name)
        for child in host_children(model, pane_id):  # "A1.1 ← A1", "task from A1" name the parent
            child.set_parent_name(name)

    async def delete(self, pane_id: str) -> None:
        model = self.model
        pane = model.find_pane(pane_id)
        if pane is not None:
            await model.close_pane(pane)
        model.store.delete_pane(pane_id)
        model.forget_saved(pane_id)
