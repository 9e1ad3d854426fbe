"""Provides the workspace: the pane grid, the panels, engine events, painting, saving and every
pane action (spawning subagents is in magnitude_tui/subagents.py)."""

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

from magnitude_tui.agents import AgentSettings
from magnitude_tui.conversations import Conversations
from magnitude_tui.engine.events import (CommandRejected, EndpointsReport, EngineFailed, EngineReady,
                                         LoadProgress, PolicyChanged, RestoreOutcome, SessionRestored,
                                         SpecChanged)
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.export import export_pane
from magnitude_tui.screens.painter import PAINT_TICK_S, Painter
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
from scheduler.types import DoneReason, Phase, Priority, Request, SamplingParams, SeqUpdate, StepReport

PUMP_WAIT_S = 0.2  # longest blocking wait for the next batch (bounds shutdown latency)
PUMP_SLICE_S = 0.02  # longest the pump holds the event loop while draining a backlog
SAVE_INTERVAL_S = 0.5  # streaming replies reach the database at most this far behind
SCHEDULER_PANEL_MIN_WIDTH = 110  # columns; narrower terminals start with the scheduler panel hidden
_PANES = Binding.Group("Pane")
_PANELS = Binding.Group("Panels")


class WorkspaceScreen(Screen):
    """Chat panes side by side; every action here also appears in the palette (commands.py)."""

    # The footer holds what fits in 120 columns; the rest (zoom, save, theme, copy, retry, restart)
    # is in the README's key table and the palette, like every action. Quit is the app's binding.
    BINDINGS = [
        Binding("ctrl+p", "app.command_palette", "Palette", priority=True),
        Binding("ctrl+n", "new_pane", "New"),
        Binding("ctrl+x", "close_pane", "Close"),
        # Priority: focus must move as the key is read, so the keys typed after it in the same
        # burst (a fast typist, tmux send-keys) reach the pane it moved to.
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
        Binding("ctrl+r", "restart_engine", "Restart", show=False),
    ]

    def __init__(self, *, client: EngineClient, store: Store, restored: list[PaneRecord],
                 export_dir: Path, sampling: SamplingParams | None = None, serve=None,
                 roles: dict[str, AgentSettings] | None = None) -> None:
        """`serve`: an object with `start(workspace)` and `dispatch(batch)` (the HTTP endpoint
        of `--serve PORT`), fed every engine batch. `roles`: named agent definitions for
        /spawn ROLE and the spawn and agent dialogs."""
        super().__init__()
        self.serve = serve
        self.roles = roles or {}
        self.sampling = sampling or SamplingParams()
        self.client = client
        self.store = store
        self.export_dir = export_dir
        self.policy = ""  # the engine's, from EngineReady and PolicyChanged
        self.engine_ready = False
        self._restored = restored
        self._resident: set[str] = set()  # sessions whose KV the current worker holds (fork sources)
        self.subagents = Subagents(self, store, self.roles)
        self.conversations = Conversations(self)
        self.turns = Turns(self)
        self._focus_after_restart: str | None = None  # the pane that had focus when ctrl+r was pressed
        self.n_ctx_seq: int | None = None  # tokens one sequence can hold (from EngineReady)
        self._panes: dict[str, ChatPane] = {}  # open panes; outlives the DOM at shutdown, for save()
        self.painter = Painter(self)
        self.batches_applied = 0  # engine batches taken in (tests wait on it, not on wall time)
        self._scheduler_chosen = False  # f3 was pressed: the panel no longer follows the width
        self.warm: dict[str, SessionRestored] = {}  # the engine's answer about each pane's saved KV
        self._warm_unsupported_said = False

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
        self.client.start()
        self.restore_sessions(self.grid.panes)
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
                self.apply_events(batch)
                if loop.time() > deadline:
                    await asyncio.sleep(0)  # let the screen repaint between slices of a backlog
                    deadline = loop.time() + PUMP_SLICE_S
                batch = self.client.poll_events(0)

    def panes_by_session(self) -> dict[str, ChatPane]:
        return dict(self._panes)

    def open_pane(self, pane: ChatPane) -> asyncio.Future:
        """Route the pane's updates from now on and mount it soon (for callers outside a handler,
        whose request may produce updates before the mount is done)."""
        self._panes[pane.session_id] = pane
        pane.context_size = self.n_ctx_seq
        self.store.add_pane(pane.record)
        return asyncio.ensure_future(self.grid.add_pane(pane, focus=False))

    async def add_pane(self, pane: ChatPane, *, focus: bool = True) -> None:
        """Mount a pane in the grid and route its session's engine updates to it."""
        self._panes[pane.session_id] = pane
        pane.context_size = self.n_ctx_seq
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

    def apply_events(self, batch: list[object]) -> None:
        """One engine batch (one step). Only bookkeeping here: panes repaint on the paint tick,
        the panels on their own timers."""
        self.batches_applied += 1
        if self.serve is not None:
            self.serve.dispatch(batch)
        for event in batch:
            if isinstance(event, StepReport):
                self.scheduler_panel.record(event)
                for update in event.updates:
                    self._route(update, event.t)
                for rejection in event.rejected:
                    self.notify(rejection.message, title="Request refused", severity="warning")
            elif isinstance(event, SeqUpdate):
                self.scheduler_panel.track(event)
                self._route(event)
            elif isinstance(event, LoadProgress):
                self.loading_view.progress(event)
            elif isinstance(event, EngineReady):
                self._ready(event)
            elif isinstance(event, EngineFailed):
                self._failed(event)
            elif isinstance(event, PolicyChanged):
                self.policy = event.policy
                self.scheduler_panel.set_policy(event.policy)
                self.notify(f"Policy is now {event.policy}")
            elif isinstance(event, SpecChanged):
                self.scheduler_panel.set_spec(event.spec)
                self.notify(f"Speculation is now {event.spec}")
            elif isinstance(event, CommandRejected):
                self.notify(event.message, severity="warning")
            elif isinstance(event, EndpointsReport):
                self.scheduler_panel.record_endpoints(event)
        restored = [e for e in batch if isinstance(e, SessionRestored)]
        if restored:
            self._warm_answers(restored)

    def restore_sessions(self, panes: list[ChatPane]) -> None:
        """Warm resume: ask the engine to bring back each conversation's saved KV, so that its next
        reply prefills only the new turn (the engine answers SessionRestored)."""
        for pane in panes:
            if pane.record.messages and not pane.busy:
                self.client.restore_session(pane.session_id, pane.conversation())

    def _warm_answers(self, answers: list[SessionRestored]) -> None:
        for answer in answers:
            self.warm[answer.session_id] = answer
            if answer.outcome is RestoreOutcome.RESTORED:
                self._resident.add(answer.session_id)  # its subagents fork its restored KV
        names = [f"{p.record.name} ({a.tokens:,} tokens)" for a in answers
                 if a.outcome is RestoreOutcome.RESTORED and (p := self._panes.get(a.session_id))]
        if names:
            self.notify(f"Restored from disk: {', '.join(names)}; their next replies start from it",
                        title="Warm resume", timeout=5)
        unsupported = next((a for a in answers if a.outcome is RestoreOutcome.UNSUPPORTED), None)
        if unsupported is not None and not self._warm_unsupported_said:
            self._warm_unsupported_said = True
            self.notify(f"No saved KV to resume from: {unsupported.detail}", title="Warm resume", timeout=5)

    def _route(self, update: SeqUpdate, t: float | None = None) -> None:
        pane = self._panes.get(update.session_id)
        if pane is None:
            return
        pane.apply(update)
        self.sequences_panel.apply(update, pane.record.name, t)
        # A finished turn leaves its conversation's KV resident; so does a cancelled one (the engine
        # keeps its committed rows). A fork of a session the engine no longer holds starts cold.
        if update.phase is Phase.DONE and update.done_reason in (DoneReason.STOP, DoneReason.LENGTH,
                                                                 DoneReason.CANCELLED):
            self._resident.add(update.session_id)

    def _ready(self, event: EngineReady) -> None:
        self.engine_ready = True
        self.app.engine_failed(None)
        self._resident.clear()
        self.policy = event.policy
        self.n_ctx_seq = event.n_ctx  # one unified KV pool: a sequence may use all of it
        for pane in self._panes.values():
            pane.context_size = event.n_ctx
        panel = self.scheduler_panel
        panel.set_engine(event.model, event.device, event.info.get("attention"))
        panel.set_policy(event.policy)
        panel.set_spec(event.spec)
        self.loading_view.display = False
        # Give focus back to the pane the user was in when ctrl+r was pressed.
        pane = self.grid.pane(self._focus_after_restart or "") or self.grid.focused_pane()
        self._focus_after_restart = None
        if pane is not None:
            self.grid.focus_pane(pane)

    def _failed(self, event: EngineFailed) -> None:
        self._resident.clear()
        self.scheduler_panel.engine_stopped()
        # The first failure carries the reason (a load error); the worker's exit comes after it.
        first = self.app.failure is None
        if first:
            self.app.engine_failed(event.message)
        if not self.engine_ready:
            self.loading_view.failed(event)
            return
        self.engine_ready = False
        hint = " Press ctrl+r to restart it." if event.restartable else ""
        self.notify(f"{event.message}{hint}", title="Engine stopped", severity="error", timeout=15)

    def action_restart_engine(self) -> None:
        if self.engine_ready and self.client.alive:
            self.notify("The engine is running")
            return
        focused = self.grid.focused_pane()
        self._focus_after_restart = focused.session_id if focused is not None else None
        self.app.engine_failed(None)
        self.loading_view.restarting()
        self.loading_view.display = True
        self.engine_ready = False
        self.client.restart()
        self.restore_sessions(self.grid.panes)

    # ---- turns --------------------------------------------------------------------------------

    @on(ChatPane.Submitted)
    async def _submitted(self, event: ChatPane.Submitted) -> None:
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
        fork = fork_from if fork_from in self._resident else None
        sampling = pane.record.settings.sampling(self.sampling)
        self.client.submit(Request(request_id, pane.session_id, pane.conversation(), sampling,
                                   fork_from=fork, priority=priority))

    def release_session(self, pane: ChatPane) -> None:
        """Give the pane's KV back to the pool (its next turn prefills again)."""
        self.client.close_session(pane.session_id)
        self._resident.discard(pane.session_id)

    # ---- actions ------------------------------------------------------------------------------

    async def action_new_pane(self) -> None:
        if self.grid.is_full:
            self.notify(f"At most {MAX_PANES} panes", severity="warning")
            return
        record = PaneRecord(uuid.uuid4().hex[:12], next_name("A", set(self.store.pane_names())),
                            position=len(self.grid.panes))
        self.store.add_pane(record)
        await self.add_pane(ChatPane(record))

    @work(exclusive=True, group="close")
    async def action_close_pane(self) -> None:
        await self.conversations.close_focused()

    async def close_pane(self, pane: ChatPane) -> None:
        """Close a pane now: cancel its reply, free its sequence and KV, keep it in the store."""
        if pane.request_id is not None:
            self.client.cancel(pane.request_id)
        self.client.close_session(pane.session_id)
        self._resident.discard(pane.session_id)
        self._save_pane(pane)
        self.store.close_pane(pane.session_id)
        self.sequences_panel.forget(pane.session_id)
        self._panes.pop(pane.session_id, None)
        await self.grid.remove_pane(pane)
        self.store.set_positions([p.session_id for p in self.grid.panes])
        if not self.grid.panes:
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

    def action_export(self) -> None:
        pane = self.grid.focused_pane()
        if pane is not None:
            self.notify(f"Exported {pane.record.name} to {export_pane(pane, self.export_dir)}")

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

