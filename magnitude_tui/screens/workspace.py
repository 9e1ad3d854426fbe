"""Provides the workspace: the pane grid, the panels, painting, saving and every pane action
(engine events are applied by screens/engine_link.py, subagents spawned by magnitude_tui/subagents.py)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer

from magnitude_tui.agents import AgentSettings, RoleBook
from magnitude_tui.conversations import Conversations
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.export import export_pane
from magnitude_tui.screens.engine_link import EngineLink
from magnitude_tui.screens.painter import PAINT_TICK_S, Painter
from magnitude_tui.screens.pane_agent import PaneAgents
from magnitude_tui.screens.policy_dialog import PolicyDialog
from magnitude_tui.screens.spawn_dialog import SpawnDialog
from magnitude_tui.store import PaneRecord, Store
from magnitude_tui.subagents import Subagents, next_name
from magnitude_tui.turns import Turns
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.composer import Composer
from magnitude_tui.widgets.loading_view import LoadingView
from magnitude_tui.widgets.pane_grid import MAX_PANES, PaneGrid
from magnitude_tui.widgets.scheduler_panel import SchedulerPanel
from magnitude_tui.widgets.sequences_panel import SequencesPanel
from scheduler.types import Priority, Request, SamplingParams

PUMP_WAIT_S = 0.2  # longest blocking wait for the next batch (bounds shutdown latency)
PUMP_SLICE_S = 0.02  # longest the pump holds the event loop while draining a backlog
SAVE_INTERVAL_S = 0.5  # streaming replies reach the database at most this far behind
ROLES_CHECK_S = 2.0  # how often the agents file is checked for changes (one stat)
SCHEDULER_PANEL_MIN_WIDTH = 110  # columns; narrower terminals start with the scheduler panel hidden
_PANES = Binding.Group("Pane")
_PANELS = Binding.Group("Panels")


class WorkspaceScreen(Screen):
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
        Binding("ctrl+g", "retry", "Retry", show=False),
        Binding("alt+left", "page_answer(-1)", "Earlier answer", show=False),
        Binding("alt+right", "page_answer(1)", "Later answer", show=False),
        Binding("ctrl+r", "restart_engine", "Restart", show=False),
    ]

    def __init__(self, *, client: EngineClient, store: Store, restored: list[PaneRecord],
                 export_dir: Path, sampling: SamplingParams | None = None, serve=None,
                 roles: RoleBook | dict[str, AgentSettings] | None = None,
                 workdir: Path | None = None) -> None:
        """`workdir`: the root agents' tools are confined to (default: the current directory). `serve`: an object with `start(workspace)` and `dispatch(batch)` (the HTTP endpoint
        of `--serve PORT`), fed every engine batch. `roles`: named agent definitions for
        /spawn ROLE and the spawn and agent dialogs (a RoleBook follows its file's changes)."""
        super().__init__()
        self.serve = serve
        self.role_book = roles if isinstance(roles, RoleBook) else RoleBook(None, roles or {})
        self.sampling = sampling or SamplingParams()
        self.client = client
        self.store = store
        self.export_dir = export_dir
        self._restored = restored
        self.subagents = Subagents(self, store, self.role_book)
        self.conversations = Conversations(self)
        self.turns = Turns(self)
        self._panes: dict[str, ChatPane] = {}  # open panes; outlives the DOM at shutdown, for save()
        self.link = EngineLink(self, self._panes)  # what the engine said: readiness, KV held, warm resume
        self.painter = Painter(self)
        self.agents = PaneAgents(self, workdir)  # panes that run as agents (tools, approval)
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
        self.subagents.restore(self._restored)
        for record in self._restored:
            await self.add_pane(ChatPane(record, parent_name=names.get(record.parent_id)), focus=False)
        if not self.grid.panes:
            await self.action_new_pane()
        self.grid.focus_pane(self.grid.panes[0])
        self.set_interval(SAVE_INTERVAL_S, self.save)
        self.set_interval(PAINT_TICK_S, self.paint)
        self.set_interval(ROLES_CHECK_S, self.check_roles)
        self.client.start()
        self.link.restore_sessions(self.grid.panes)
        await self.turns.send_restored_queue(self.grid.panes)
        self.run_worker(self._pump_events(), name="engine-events", exclusive=True)
        if self.serve is not None:
            self.serve.start(self)

    async def _pump_events(self) -> None:
        """Apply engine batches (one per step) as they come, draining a backlog in one go.

        The blocking wait runs on a thread; everything already queued is then taken without a
        thread hop each, so a fast engine (thousands of steps a second) cannot outrun the UI.
        """
        loop = asyncio.get_running_loop()
        while self.grid.is_attached:
            batch = await loop.run_in_executor(None, self.client.poll_events, PUMP_WAIT_S)
            deadline = loop.time() + PUMP_SLICE_S
            while batch is not None and self.grid.is_attached:
                self.link.apply(batch)
                if loop.time() > deadline:
                    await asyncio.sleep(0)  # let the screen repaint between slices of a backlog
                    deadline = loop.time() + PUMP_SLICE_S
                batch = self.client.poll_events(0)

    @property
    def roles(self) -> dict[str, AgentSettings]:
        """The agent definitions as the file says now (it is read again when it changed)."""
        return self.role_book.roles

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
        return dict(self._panes)

    def open_pane(self, pane: ChatPane) -> asyncio.Future:
        """Route the pane's updates from now on and mount it soon (for callers outside a handler,
        whose request may produce updates before the mount is done)."""
        self._panes[pane.session_id] = pane
        pane.context_size = self.link.n_ctx_seq
        self.store.add_pane(pane.record)
        return asyncio.ensure_future(self.grid.add_pane(pane, focus=False))

    async def add_pane(self, pane: ChatPane, *, focus: bool = True) -> None:
        """Mount a pane in the grid and route its session's engine updates to it."""
        self._panes[pane.session_id] = pane
        pane.context_size = self.link.n_ctx_seq
        await self.grid.add_pane(pane, focus=focus)

    def on_unmount(self) -> None:
        self.save()

    # ---- what subagents use (SubagentHost) ------------------------------------------------------

    def pane_count(self) -> int:
        return len(self.grid.panes)

    def find_pane(self, session_id: str) -> ChatPane | None:
        return self.grid.pane(session_id)

    def warn(self, message: str) -> None:
        self.notify(message, severity="warning")

    async def paint(self) -> None:
        """The paint tick (screens/painter.py decides which panes flush their buffered text)."""
        await self.painter.paint()

    # ---- engine events ------------------------------------------------------------------------

    @property
    def engine_ready(self) -> bool:
        return self.link.ready

    @property
    def policy(self) -> str:
        return self.link.policy

    def action_restart_engine(self) -> None:
        self.link.restart()

    # ---- turns --------------------------------------------------------------------------------

    @on(ChatPane.Submitted)
    async def _submitted(self, event: ChatPane.Submitted) -> None:
        if self._panes.get(event.pane.session_id) is not event.pane:
            # Closed between Enter and now: its conversation is off screen, so nothing goes to it.
            focused = self.grid.focused_pane()
            if focused is not None:
                focused.return_to_composer([event.text])
            self.notify(f"{event.pane.record.name} was closed before its message was sent; the text is "
                        "back in the composer, unsent", severity="warning", markup=False)
            return
        await self.turns.submitted(event.pane, event.text, event.editing)

    @on(ChatPane.ReplyFinished)
    async def _reply_finished(self, event: ChatPane.ReplyFinished) -> None:
        await self.turns.reply_finished(event)

    @on(Composer.KeyShown)
    async def _key_shown(self, event: Composer.KeyShown) -> None:
        await self.painter.after_key()

    @on(Composer.RecallRequested)
    def _recall(self, event: Composer.RecallRequested) -> None:
        pane = self.grid.focused_pane()
        if pane is not None and pane.composer is event.composer:
            self.turns.edit_last(pane)

    def submit_turn(self, pane: ChatPane, *, fork_from: str | None = None,
                    priority: Priority = Priority.INTERACTIVE) -> None:
        """Send the pane's conversation as a new request; it forks `fork_from`'s KV when the
        current worker holds it (else the engine prefills it cold). A person's turn is
        interactive; spawned subagents pass their own class."""
        request_id = f"{pane.session_id}:{uuid.uuid4().hex[:8]}"
        pane.begin_request(request_id)
        fork = self.link.fork_source(fork_from)
        sampling = pane.record.settings.sampling(self.sampling)
        self.client.submit(Request(request_id, pane.session_id, pane.conversation(), sampling,
                                   fork_from=fork, priority=priority, prompt=pane.raw_prompt()))

    def release_session(self, pane: ChatPane) -> None:
        """Give the pane's KV back to the pool (its next turn prefills again)."""
        self.client.close_session(pane.session_id)
        self.link.forget(pane.session_id)

    # ---- actions ------------------------------------------------------------------------------

    async def action_new_pane(self) -> None:
        if self.grid.is_full:
            self.notify(f"At most {MAX_PANES} panes", severity="warning")
            return
        record = PaneRecord(uuid.uuid4().hex[:12], next_name("A", set(self.store.pane_names())),
                            position=len(self.grid.panes))
        self.store.add_pane(record)
        await self.add_pane(ChatPane(record))

    async def action_close_pane(self) -> None:
        await self.conversations.close_focused()

    async def close_pane(self, pane: ChatPane, *, replace: bool = True) -> None:
        """Close a pane now: cancel its reply, free its sequence and KV, keep it in the store
        (`replace`: the last pane closed gives way to a new empty one)."""
        if pane.request_id is not None:
            self.client.cancel(pane.request_id)
        self.client.close_session(pane.session_id)
        self.link.forget(pane.session_id)
        self._save_pane(pane)
        self.store.close_pane(pane.session_id)
        self.sequences_panel.forget(pane.session_id)
        self._panes.pop(pane.session_id, None)
        await self.grid.remove_pane(pane)
        self.store.set_positions([p.session_id for p in self.grid.panes])
        if replace and not self.grid.panes:
            await self.action_new_pane()

    @work(exclusive=True, group="conversations")
    async def action_conversations(self) -> None:
        await self.conversations.choose()

    def action_next_pane(self) -> None:
        self.grid.cycle(1)

    def action_prev_pane(self) -> None:
        self.grid.cycle(-1)

    def action_zoom(self) -> None:
        self.grid.toggle_zoom()

    def action_cancel(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None and self.agents.stop(pane):  # its turn, tool or approval wait ends
            return
        if pane is not None and pane.request_id is not None:
            self.client.cancel(pane.request_id)

    @work
    async def action_spawn(self) -> None:
        parent = self.grid.focused_pane()
        if parent is None:
            return
        spec = await self.app.push_screen_wait(SpawnDialog(parent.record.name, roles=tuple(self.roles)))
        if spec is not None:
            await self.subagents.spawn(parent, spec)

    async def action_burst(self) -> None:
        parent = self.grid.focused_pane()
        if parent is not None:
            await self.subagents.burst(parent)

    def action_agent_hint(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            pane.return_to_composer(["/agent "])
            pane.focus_composer()

    @work
    async def action_policy(self) -> None:
        policy = await self.app.push_screen_wait(PolicyDialog(self.policy))
        if policy:
            self.switch_policy(policy)

    def switch_spec(self, mode: str) -> None:
        self.client.set_spec(mode)  # the panel changes when SpecChanged comes back

    def switch_policy(self, policy: str) -> None:
        self.client.set_policy(policy)  # the panel changes when PolicyChanged comes back

    @work(exclusive=True, group="agent")
    async def action_agent_settings(self) -> None:
        await self.conversations.edit_settings()

    async def action_retry(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            await self.turns.retry(pane)

    async def action_page_answer(self, step: int) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            await self.turns.page_answer(pane, step)

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
        if not answer:
            self.notify("No answer to copy yet", severity="warning")
            return
        self.app.copy_to_clipboard(answer)
        self.notify(f"Copied {len(answer)} characters from {pane.record.name}")

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

    # ---- persistence --------------------------------------------------------------------------

    def save(self) -> None:
        """Hand every new or changed message to the store (runs on a timer and at exit)."""
        for pane in self._panes.values():
            self._save_pane(pane)

    def _save_pane(self, pane: ChatPane) -> None:
        changed = pane.take_unsaved()
        existing = [m for m in changed if m.id is not None]
        for message in changed:
            if message.id is None:
                self.store.add_message(pane.session_id, message)
        self.store.save_messages(existing)

