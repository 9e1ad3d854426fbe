"""Provides the workspace screen's dialog actions: each asks in a dialog, then hands the answer to
the workspace model (close, the conversation list, agent settings, spawn, policy) or acts on the
focused pane (export, copy)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from textual import work
from textual.notifications import SeverityLevel
from textual.screen import Screen

from magnitude_tui.agents import AgentSettings
from magnitude_tui.export import export_pane
from magnitude_tui.screens.agent_dialog import AgentDialog
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.screens.conversation_list import ConversationList, ListAction, ListChoice
from magnitude_tui.screens.policy_dialog import PolicyDialog
from magnitude_tui.screens.spawn_dialog import SpawnDialog

if TYPE_CHECKING:
    from magnitude_tui.engine.protocol import EngineClient
    from magnitude_tui.screens.pane_agent import PaneAgents
    from magnitude_tui.widgets.pane_grid import PaneGrid
    from magnitude_tui.workspace.model import WorkspaceModel


class DialogActions(Screen):
    """The workspace screen's actions that ask in a dialog first; WorkspaceScreen is one and sets
    what is declared here."""

    agents: PaneAgents
    client: EngineClient
    export_dir: Path
    grid: PaneGrid
    model: WorkspaceModel

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast, as plain text unless asked otherwise: what the workspace says holds names,
        messages and policies the user typed, and a toast reads its text as markup when drawn, so
        a pane renamed "[/x]" ended the app with MarkupError as its close toast came up."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    @property
    def roles(self) -> dict[str, AgentSettings]:
        """The agent definitions as the file says now (it is read again when it changed)."""
        return self.model.roles

    @property
    def policy(self) -> str:
        return self.model.policy

    def switch_policy(self, policy: str) -> None:
        self.client.set_policy(policy)  # the panel changes when PolicyChanged comes back

    async def action_close_pane(self) -> None:
        """ctrl+x: close the focused pane now, or ask first if it is still replying. Either way it
        is done before the next key is read (the binding is a priority one): the keys after
        ctrl+x reach the pane that takes the focus, or the dialog, never the pane being closed."""
        pane = self.grid.focused_pane()
        if pane is None:
            return
        agent = self.agents.running(pane)  # between turns (a tool runs) the pane is not busy
        if not pane.busy and not agent:
            await self.model.conversations.close(pane)
            return
        name = pane.record.name
        doing = "is running an agent. Closing stops the agent" if agent else "is still replying. Closing stops the reply"

        async def answered(ok: bool | None) -> None:
            if ok and pane.is_attached:
                await self.model.conversations.close(pane)

        await self.app.push_screen(ConfirmDialog(
            f"Close {name}?",
            f"{name} {doing} and frees its sequence; the conversation stays saved and f4 "
            "reopens it.", confirm="Close"), answered)

    @work(exclusive=True, group="conversations")
    async def action_conversations(self) -> None:
        """f4: the conversation list; act on what the user picked there."""
        self.model.save()  # what was typed or streamed since the last save tick is listed too
        choice: ListChoice | None = await self.app.push_screen_wait(ConversationList(self.model.store.conversations))
        if choice is None:
            return
        conversations = self.model.conversations
        if choice.action is ListAction.OPEN:
            await conversations.open(choice.row.id)
        elif choice.action is ListAction.OPEN_WORKSPACE:
            await conversations.open_workspace(choice.row.workspace_id)
        elif choice.action is ListAction.RENAME:
            conversations.rename(choice.row.id, choice.name)
        elif choice.action is ListAction.DELETE:
            ok = await self.app.push_screen_wait(ConfirmDialog(
                f"Delete {choice.row.name}?",
                f"{choice.row.messages} messages are removed from the database for good.", confirm="Delete"))
            if ok:
                await conversations.delete(choice.row.id)

    @work(exclusive=True, group="agent")
    async def action_agent_settings(self) -> None:
        """f6: the focused pane's role, system prompt and sampling, from its next turn on."""
        pane = self.grid.focused_pane()
        if pane is None:
            return
        settings = await self.app.push_screen_wait(AgentDialog(pane.record.name, pane.record.settings, self.roles))
        if settings is not None and pane.is_attached:
            self.model.conversations.set_settings(pane, settings)

    @work
    async def action_spawn(self) -> None:
        parent = self.grid.focused_pane()
        if parent is None:
            return
        spec = await self.app.push_screen_wait(SpawnDialog(parent.record.name, roles=tuple(self.roles)))
        if spec is not None:
            await self.model.subagents.spawn(parent, spec)

    @work
    async def action_policy(self) -> None:
        policy = await self.app.push_screen_wait(PolicyDialog(self.policy))
        if policy:
            self.switch_policy(policy)

    def action_export(self) -> None:
        pane = self.grid.focused_pane()
        if pane is None:
            return
        try:
            path = export_pane(pane, self.export_dir)
        except OSError as exc:
            self.notify(f"Could not export {pane.record.name} to {self.export_dir}: {exc}", severity="error",
                        markup=False)
            return
        self.notify(f"Exported {pane.record.name} to {path}", timeout=10, markup=False)

    def action_copy_answer(self) -> None:
        pane = self.grid.focused_pane()
        answer = pane.last_answer() if pane is not None else None
        if pane is None or not answer:
            self.notify("No answer to copy yet", severity="warning")
            return
        self.app.copy_to_clipboard(answer)
        self.notify(f"Copied {len(answer)} characters from {pane.record.name}")
