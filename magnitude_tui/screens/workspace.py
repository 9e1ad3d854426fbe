"""Provides the workspace screen: the pane grid, the panels, painting and every pane action. What
the actions change lives in the workspace model (magnitude_tui/workspace/), which talks back through
WorkspaceHost; the engine's batches reach the screen through its inbox (screens/engine_link.py)."""

from __future__ import annotations

from pathlib import Path

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Footer

from magnitude_tui.agents import AgentSettings, RoleBook
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.screens.engine_link import EngineLink
from magnitude_tui.screens.painter import PAINT_TICK_S, Painter
from magnitude_tui.screens.pane_agent import PaneAgents
from magnitude_tui.screens.workspace_dialogs import DialogActions
from magnitude_tui.store import PaneRecord, Store
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.composer import Composer
from magnitude_tui.widgets.loading_view import LoadingView
from magnitude_tui.widgets.pane_grid import PaneGrid
from magnitude_tui.widgets.scheduler_panel import SchedulerPanel
from magnitude_tui.widgets.sequences_panel import SequencesPanel
from magnitude_tui.workspace.model import WorkspaceModel
from scheduler.speculation import SpecMode
from scheduler.types import SamplingParams

SAVE_INTERVAL_S = 0.5  # streaming replies reach the database at most this far behind
ROLES_CHECK_S = 2.0  # how often the agents file is checked for changes (one stat)
SCHEDULER_PANEL_MIN_WIDTH = 110  # columns; narrower terminals start with the scheduler panel hidden
_PANES = Binding.Group("Pane")
_PANELS = Binding.Group("Panels")


class WorkspaceScreen(DialogActions):
    """Chat panes side by side; every action here also appears in the palette (commands.py)."""

    # The footer holds what fits in 120 columns; the rest (zoom, save, theme, copy, retry, restart)
    # is in the README's key table and the palette, like every action. Quit is the app's binding.
    BINDINGS = [
        Binding("ctrl+p", "app.command_palette", "Palette", priority=True),
        # Priority (these four): focus must move as the key is read, so the keys typed after it
        # in the same burst (a fast typist, tmux send-keys) reach the pane it moved to (or the
        # close dialog). Without it the action ran only once the key had bubbled back up from the
        # old composer, and the keys read meanwhile were typed there and sent to its conversation,
        # even to one being closed.
        Binding("ctrl+n", "new_pane", "New", priority=True),
        Binding("ctrl+x", "close_pane", "Close", priority=True),
        Binding("tab", "next_pane", "Next pane", key_display="⇥", group=_PANES, priority=True),
        Binding("shift+tab", "prev_pane", "Previous pane", key_display="⇤", group=_PANES, priority=True),
        Binding("ctrl+o", "zoom", "Zoom", show=False),
        Binding("escape", "cancel", "Stop"),
        Binding("ctrl+s", "spawn", "Spawn"),
        Binding("ctrl+b", "burst", "Burst"),
        Binding("ctrl+l", "policy", "Policy"),
        Binding("f4", "conversations", "Chats"),
        Binding("f6", "agent_settings", "Agent"),
        Binding("f5", "export", "Save", show=False),
        Binding("f2", "toggle_sequences", "Sequences panel", group=_PANELS),
        Binding("f3", "toggle_scheduler", "Scheduler panel", group=_PANELS),
        Binding("ctrl+t", "app.change_theme", "Theme", show=False),
        Binding("ctrl+y", "copy_answer", "Copy", show=False),
        # Tool blocks unfold on a click; the keyboard cannot focus one (tab moves between panes).
        Binding("f8", "tool_details", "Tool details", show=False),
        Binding("ctrl+g", "retry", "Retry", show=False),
        Binding("alt+left", "page_answer(-1)", "Earlier answer", show=False),
        Binding("alt+right", "page_answer(1)", "Later answer", show=False),
        Binding("ctrl+r", "restart_engine", "Restart", show=False),
    ]

    class PanesReady(Message):
        """The restored panes are mounted: the app may start the engine (their updates have
        somewhere to go)."""

        def __init__(self, workspace: WorkspaceScreen) -> None:
            super().__init__()
            self.workspace = workspace

    class EngineStatus(Message):
        """The engine is down (`reason`) or up again (None): the app keeps why, for its exit code."""

        def __init__(self, reason: str | None) -> None:
            super().__init__()
            self.reason = reason

    def __init__(self, *, client: EngineClient, store: Store, restored: list[PaneRecord],
                 export_dir: Path, sampling: SamplingParams | None = None,
                 roles: RoleBook | dict[str, AgentSettings] | None = None,
                 workdir: Path | None = None) -> None:
        """`workdir`: the root agents' tools are confined to (default: the current directory).
        `roles`: named agent definitions for /spawn ROLE and the spawn and agent dialogs (a
        RoleBook follows its file's changes)."""
        super().__init__()
        self.role_book = roles if isinstance(roles, RoleBook) else RoleBook(None, roles or {})
        self.client = client
        self.store = store
        self.export_dir = export_dir
        self._restored = restored
        self.model = WorkspaceModel(self, client=client, store=store, roles=self.role_book,
                                    sampling=sampling)
        self.turns = self.model.turns
        self.conversations = self.model.conversations
        self.subagents = self.model.subagents
        self.link = EngineLink(self)  # the engine's batches, from the app's pump
        self.painter = Painter(self)
        self.agents = PaneAgents(self, workdir)  # panes that run as agents (tools, approval)
        self.api_panes = None  # under --serve: a pane per HTTP conversation (serve/panes.py)
        self._engine_shown = False  # the loading view gave way to a ready engine
        self._focus_after_restart: str | None = None  # the pane that had focus when ctrl+r was pressed
        self._warm_unsupported_said = False
        self._scheduler_chosen = False  # f3 was pressed: the panel no longer follows the width

    def compose(self) -> ComposeResult:
        # Held directly: engine events keep arriving while the DOM is torn down at exit.
        target = self.client.target
        self.loading_view = LoadingView(target.model or None, target.where, id="loading")
        self.grid = PaneGrid(id="panes")
        self.scheduler_panel = SchedulerPanel(id="scheduler")
        self.sequences_panel = SequencesPanel(id="sequences")
        # The loading view sits above the panes, not instead of them: a message typed while the
        # model loads is reported `loading` and runs when the engine is ready.
        yield self.loading_view
        with Horizontal(id="workspace"):
            yield self.grid
            yield self.scheduler_panel
        yield self.sequences_panel
        yield Footer(compact=True, show_command_palette=False)

    async def on_mount(self) -> None:
        self.sequences_panel.display = False
        names = {r.id: r.name for r in self._restored}
        self.model.subagents.restore(self._restored)
        for record in self._restored:
            await self.model.open_record(record, parent_name=names.get(record.parent_id or ""))
        if not self.grid.panes:
            await self.model.new_pane()
        self.grid.focus_pane(self.grid.panes[0])
        self.set_interval(SAVE_INTERVAL_S, self.save)
        self.set_interval(PAINT_TICK_S, self.paint)
        self.set_interval(ROLES_CHECK_S, self.check_roles)
        self.post_message(self.PanesReady(self))

    async def on_unmount(self) -> None:
        self.save()
        await self.agents.close()

    def save(self) -> None:
        """Hand every new or changed message to the store (runs on a timer and at exit)."""
        self.model.save()

    async def engine_started(self) -> None:
        """The app started the engine and its pump: bring back the panes' saved KV and send what
        a quit left queued."""
        self.model.restore_sessions(self.grid.panes)
        await self.model.turns.send_restored_queue(self.grid.panes)

    async def add_pane(self, pane: ChatPane, *, focus: bool = True) -> None:
        """Mount a pane in the grid and route its session's engine updates to it."""
        await self.model.add_pane(pane, focus=focus)

    def open_pane(self, pane: ChatPane):
        """A pane opened outside a handler (an HTTP conversation, an agent's subagent)."""
        return self.model.open_pane(pane)

    @property
    def sampling(self) -> SamplingParams:
        return self.model.sampling

    def check_roles(self) -> None:
        """Say when the agents file changed: its new roles, or why it cannot be used."""
        book = self.role_book
        before = book.problem
        if book.reload():
            self.notify(f"{book.path} reloaded; roles: {', '.join(book.roles) or 'none'}", timeout=6,
                        markup=False)
        elif book.problem and book.problem != before:
            self.notify(f"{book.problem} (the roles stay as they were until the file is fixed)",
                        severity="error", timeout=10, markup=False)

    def panes_by_session(self) -> dict[str, ChatPane]:
        return dict(self.model.panes)

    async def paint(self) -> None:
        """The paint tick (screens/painter.py decides which panes flush their buffered text)."""
        await self.painter.paint()

    # ---- what the model asks (WorkspaceHost) ----------------------------------------------------

    def grid_panes(self) -> list[ChatPane]:
        return self.grid.panes

    def focused_pane(self) -> ChatPane | None:
        return self.grid.focused_pane()

    def focus_pane(self, pane: ChatPane) -> None:
        self.grid.focus_pane(pane)

    def make_pane(self, record: PaneRecord, parent_name: str | None) -> ChatPane:
        return ChatPane(record, parent_name=parent_name)

    async def mount_pane(self, pane: ChatPane, *, focus: bool) -> None:
        await self.grid.add_pane(pane, focus=focus)

    async def unmount_pane(self, pane: ChatPane) -> None:
        self.sequences_panel.forget(pane.session_id)
        await self.grid.remove_pane(pane)

    def perform(self, action: str) -> None:
        getattr(self, f"action_{action}")()

    def agent_running(self, pane: ChatPane) -> bool:
        return self.agents.running(pane)

    def stop_agent(self, pane: ChatPane) -> bool:
        return self.agents.stop(pane)

    async def start_agent(self, pane: ChatPane, task: str, role: str | None = None) -> None:
        await self.agents.start(pane, task, role)

    def warn(self, message: str) -> None:
        self.notify(message, severity="warning")

    # ---- engine events ------------------------------------------------------------------------

    @property
    def engine_ready(self) -> bool:
        """The engine is ready and the screen shows it so."""
        return self._engine_shown and self.model.ready

    @on(EngineLink.Batches)
    def _batches(self) -> None:
        self.link.take_batches()

    @on(EngineLink.Ready)
    def _ready(self, message: EngineLink.Ready) -> None:
        event = message.event
        self._engine_shown = True
        self.post_message(self.EngineStatus(None))
        panel = self.scheduler_panel
        panel.set_engine(event.model, event.device, event.info.attention)
        panel.set_policy(event.policy)
        panel.set_spec(event.spec)
        self.loading_view.display = False
        if event.info.template_notice:  # no chat template: ChatML stands in (template_fallback.py)
            self.notify(event.info.template_notice, title="Chat template", severity="warning", timeout=20)
        # Give focus back to the pane the user was in when ctrl+r was pressed.
        pane = self.grid.pane(self._focus_after_restart or "") or self.grid.focused_pane()
        self._focus_after_restart = None
        if pane is not None:
            self.grid.focus_pane(pane)

    @on(EngineLink.Failed)
    def _failed(self, message: EngineLink.Failed) -> None:
        event = message.event
        self._engine_shown = False
        self.scheduler_panel.engine_stopped()
        self.post_message(self.EngineStatus(event.message))
        if not message.was_ready:
            self.loading_view.failed(event)
            return
        hint = " Press ctrl+r to restart it." if event.restartable else ""
        self.notify(f"{event.message}{hint}", title="Engine stopped", severity="error", timeout=15)

    @on(EngineLink.PolicySet)
    def _policy_set(self, message: EngineLink.PolicySet) -> None:
        self.scheduler_panel.set_policy(message.policy)
        self.notify(f"Policy is now {message.policy}")

    @on(EngineLink.SpecSet)
    def _spec_set(self, message: EngineLink.SpecSet) -> None:
        self.scheduler_panel.set_spec(message.spec)
        self.notify(f"Speculation is now {message.spec}")

    @on(EngineLink.Restored)
    def _restored_kv(self, message: EngineLink.Restored) -> None:
        if message.names:
            self.notify(f"Restored from disk: {', '.join(message.names)}; their next replies start from it",
                        title="Warm resume", timeout=5)
        if message.unsupported is not None and not self._warm_unsupported_said:
            self._warm_unsupported_said = True
            self.notify(f"No saved KV to resume from: {message.unsupported}", title="Warm resume", timeout=5)

    def action_restart_engine(self) -> None:
        if self.model.ready and self.client.alive:
            self.notify("The engine is running")
            return
        focused = self.grid.focused_pane()
        self._focus_after_restart = focused.session_id if focused is not None else None
        self.post_message(self.EngineStatus(None))
        self.loading_view.restarting()
        self.loading_view.display = True
        self.model.ready = self._engine_shown = False
        self.client.restart()
        self.model.restore_sessions(self.grid.panes)

    # ---- turns --------------------------------------------------------------------------------

    @on(ChatPane.Submitted)
    async def _submitted(self, event: ChatPane.Submitted) -> None:
        if self.model.panes.get(event.pane.session_id) is not event.pane:
            # Closed between Enter and now: its conversation is off screen, so nothing goes to it.
            focused = self.grid.focused_pane()
            if focused is not None:
                focused.return_to_composer([event.text])
            self.notify(f"{event.pane.record.name} was closed before its message was sent; the text is "
                        "back in the composer, unsent", severity="warning", markup=False)
            return
        await self.model.turns.submitted(event.pane, event.text, event.editing)

    @on(ChatPane.ReplyFinished)
    async def _reply_finished(self, event: ChatPane.ReplyFinished) -> None:
        await self.model.turns.reply_finished(event)

    @on(Composer.KeyShown)
    async def _key_shown(self, event: Composer.KeyShown) -> None:
        await self.painter.after_key()

    @on(Composer.StopRequested)
    def _stop_requested(self, event: Composer.StopRequested) -> None:
        pane = self.grid.focused_pane()
        if pane is None or pane.composer is not event.composer:
            return
        if not self._stop(pane):  # nothing to stop: Textual's own answer to ctrl+c, how to quit
            self.app.action_help_quit()

    @on(Composer.RecallRequested)
    def _recall(self, event: Composer.RecallRequested) -> None:
        pane = self.grid.focused_pane()
        if pane is not None and pane.composer is event.composer:
            self.model.turns.edit_last(pane)

    # ---- actions (the dialogs ask here; the model acts on the answers) ------------------------

    async def action_new_pane(self) -> None:
        await self.model.new_pane()

    async def close_pane(self, pane: ChatPane, *, replace: bool = True) -> None:
        await self.model.close_pane(pane, replace=replace)

    def action_next_pane(self) -> None:
        self.grid.cycle(1)

    def action_prev_pane(self) -> None:
        self.grid.cycle(-1)

    def action_zoom(self) -> None:
        self.grid.toggle_zoom()

    def action_tool_details(self) -> None:
        """f8: unfold every tool block of the focused pane (arguments and result), or fold them."""
        pane = self.grid.focused_pane()
        if pane is not None and not pane.toggle_tool_details():
            self.notify(f"{pane.record.name} shows no tool calls", severity="warning")

    def action_cancel(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            self._stop(pane)

    def _stop(self, pane: ChatPane) -> bool:
        """Stop the pane's agent (its turn, tool or approval wait ends) or its reply; False when
        neither runs."""
        if self.agents.stop(pane):
            return True
        if pane.replies.request_id is not None:
            self.client.cancel(pane.replies.request_id)
            return True
        return False

    async def action_burst(self) -> None:
        parent = self.grid.focused_pane()
        if parent is not None:
            await self.model.subagents.burst(parent)

    def action_agent_hint(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            pane.return_to_composer(["/agent "])
            pane.focus_composer()

    def switch_spec(self, mode: SpecMode) -> None:
        self.client.set_spec(mode)  # the panel changes when SpecChanged comes back

    async def action_retry(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            await self.model.turns.retry(pane)

    async def action_page_answer(self, step: int) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            await self.model.turns.page_answer(pane, step)

    def action_toggle_sequences(self) -> None:
        panel = self.sequences_panel
        panel.display = not panel.display

    def action_toggle_scheduler(self) -> None:
        panel = self.scheduler_panel
        panel.display = not panel.display
        self._scheduler_chosen = True  # the user decides from now on, whatever the width

    def on_resize(self, event: events.Resize) -> None:
        # The scheduler panel is 44 columns: on a narrow terminal (80x24) it would take more room
        # than the chat. Until the user toggles it (f3), it shows only where the panes keep most.
        if not self._scheduler_chosen:
            self.scheduler_panel.display = event.size.width >= SCHEDULER_PANEL_MIN_WIDTH
