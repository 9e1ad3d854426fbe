"""Provides conversation management for the workspace: closing a pane (asking first when it is
replying), the conversation list's open, reopen (one pane or a whole workspace), rename and
delete, and a pane's agent settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnitude_tui.engine.warm_store import discard_saved
from magnitude_tui.names import first_free
from magnitude_tui.screens.agent_dialog import AgentDialog
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.screens.conversation_list import ConversationList, ListAction, ListChoice
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.pane_grid import MAX_PANES

if TYPE_CHECKING:
    from magnitude_tui.screens.workspace import WorkspaceScreen


def free_name(name: str, taken: set[str]) -> str:
    """`name` if no open pane has it, else the first free of `name (2)`, `name (3)`..."""
    return first_free(taken, lambda k: name if k == 1 else f"{name} ({k})")


def untouched(pane: ChatPane) -> bool:
    """Nothing in it: no message, nothing queued or typed, no reply running (closing loses nothing)."""
    return not (pane.record.messages or pane.queued or pane.busy or pane.composer.text.strip())


class Conversations:
    """What happens to whole conversations; the workspace owns one and calls it from its actions
    (both run inside workers, since they wait for dialogs)."""

    def __init__(self, workspace: "WorkspaceScreen") -> None:
        self.workspace = workspace

    async def close_focused(self) -> None:
        """ctrl+x: close the focused pane now, or ask first if it is still replying. Either way it
        is done before the next key is read (the binding is a priority one): the keys after
        ctrl+x reach the pane that takes the focus, or the dialog, never the pane being closed."""
        ws = self.workspace
        pane = ws.grid.focused_pane()
        if pane is None:
            return
        if not pane.busy:
            await self.close(pane)
            return
        name = pane.record.name

        async def answered(ok: bool | None) -> None:
            if ok and pane.is_attached:
                await self.close(pane)

        await ws.app.push_screen(ConfirmDialog(
            f"Close {name}?",
            f"{name} is still replying. Closing stops the reply and frees its sequence; the "
            "conversation stays saved and f4 reopens it.", confirm="Close"), answered)

    async def close(self, pane: ChatPane) -> None:
        name = pane.record.name
        await self.workspace.close_pane(pane)
        self.workspace.notify(f"Closed {name} · f4 lists conversations to reopen it", timeout=4)

    async def choose(self) -> None:
        """f4: the conversation list; act on what the user picked there."""
        ws = self.workspace
        choice: ListChoice | None = await ws.app.push_screen_wait(ConversationList(ws.store.conversations))
        if choice is None:
            return
        if choice.action is ListAction.OPEN:
            await self.open(choice.row.id)
        elif choice.action is ListAction.OPEN_WORKSPACE:
            await self.open_workspace(choice.row.workspace_id)
        elif choice.action is ListAction.RENAME:
            self.rename(choice.row.id, choice.name)
        elif choice.action is ListAction.DELETE:
            ok = await ws.app.push_screen_wait(ConfirmDialog(
                f"Delete {choice.row.name}?",
                f"{choice.row.messages} messages are removed from the database for good.", confirm="Delete"))
            if ok:
                await self.delete(choice.row.id)

    async def open(self, pane_id: str) -> ChatPane | None:
        """Focus the conversation's pane, reopening it (from any workspace) when it is closed."""
        ws = self.workspace
        pane = ws.grid.pane(pane_id)
        if pane is None:
            if ws.grid.is_full:
                ws.notify(f"At most {MAX_PANES} panes; close one first", severity="warning")
                return None
            taken = set(ws.store.pane_names())
            record = ws.store.reopen_pane(pane_id, len(ws.grid.panes))
            if record.name in taken:  # a new pane took the name while this one was closed
                old, record.name = record.name, free_name(record.name, taken)
                ws.store.rename_pane(record.id, record.name)
                ws.notify(f"{old} is open already; the reopened conversation is {record.name}", timeout=5)
            parent = ws.grid.pane(record.parent_id or "")
            ws.subagents.restore([record])
            pane = ChatPane(record, parent_name=parent.record.name if parent else None)
            await ws.add_pane(pane, focus=False)
            ws.store.set_positions([p.session_id for p in ws.grid.panes])
            ws.link.restore_sessions([pane])
            await ws.turns.send_restored_queue([pane])
        ws.grid.focus_pane(pane)
        return pane

    async def open_workspace(self, workspace_id: int) -> list[ChatPane]:
        """Reopen every pane that was open when workspace `workspace_id` was last used, in its
        order; the untouched empty panes here give way to them (a fresh launch opens one)."""
        ws = self.workspace
        wanted = [i for i in ws.store.workspace_panes(workspace_id) if ws.grid.pane(i) is None]
        if not wanted:
            ws.notify("Every conversation of that workspace is open already", timeout=4)
            return []
        for pane in [p for p in ws.grid.panes if untouched(p)]:
            await ws.close_pane(pane, replace=False)
            ws.store.delete_pane(pane.session_id)  # nothing in it worth listing in f4
        opened = []
        for pane_id in wanted:
            pane = await self.open(pane_id)
            if pane is None:  # the grid is full (open() said so)
                break
            opened.append(pane)
        if not ws.grid.panes:
            await ws.action_new_pane()
        elif opened:
            ws.grid.focus_pane(opened[0])
        return opened

    async def edit_settings(self) -> None:
        """f6: the focused pane's role, system prompt and sampling, from its next turn on."""
        ws = self.workspace
        pane = ws.grid.focused_pane()
        if pane is None:
            return
        settings = await ws.app.push_screen_wait(AgentDialog(pane.record.name, pane.record.settings, ws.roles))
        if settings is not None and pane.is_attached:
            pane.apply_settings(settings)
            ws.store.set_pane_settings(pane.session_id, settings)

    def rename(self, pane_id: str, name: str) -> None:
        ws = self.workspace
        pane = ws.grid.pane(pane_id)
        if pane is not None and name != pane.record.name and name in ws.store.pane_names():
            ws.notify(f"{name} is already taken in this workspace", severity="warning")
            return
        ws.store.rename_pane(pane_id, name)
        if pane is not None:
            pane.rename(name)

    async def delete(self, pane_id: str) -> None:
        ws = self.workspace
        pane = ws.grid.pane(pane_id)
        if pane is not None:
            await ws.close_pane(pane)
        ws.store.delete_pane(pane_id)
        if ws.app.warm_dir is not None:
            discard_saved(ws.app.warm_dir, pane_id)
