"""Provides the workspace's side of its engine: each batch of engine events applied to the panes
and panels, which sessions' KV the current worker holds (fork sources), the warm-resume answers,
and restarting the engine. The workspace (screens/workspace.py) owns the widgets; this owns what
the engine said."""

from __future__ import annotations

from typing import TYPE_CHECKING

from magnitude_tui.engine.events import (CommandRejected, EndpointsReport, EngineFailed, EngineReady,
                                         LoadProgress, PolicyChanged, RestoreOutcome, SessionRestored,
                                         SpecChanged)
from magnitude_tui.engine.events import SeqUpdate, StepReport
from scheduler.types import DoneReason, Phase

if TYPE_CHECKING:
    from magnitude_tui.screens.workspace import WorkspaceScreen
    from magnitude_tui.widgets.chat_pane import ChatPane

# A finished turn leaves its conversation's KV resident; so does a cancelled one (the engine keeps
# its committed rows). A fork of a session the engine no longer holds starts cold.
_KEEPS_KV = (DoneReason.STOP, DoneReason.LENGTH, DoneReason.CANCELLED)


class EngineLink:
    """What the workspace knows of its engine, kept up to date from the engine's event batches."""

    def __init__(self, ws: WorkspaceScreen, panes: dict[str, ChatPane]) -> None:
        """`panes`: the workspace's open panes by session (the same dict, kept by the workspace)."""
        self.ws = ws
        self._panes = panes
        self.ready = False
        self.policy = ""  # the engine's, from EngineReady and PolicyChanged
        self.n_ctx_seq: int | None = None  # tokens one sequence can hold (from EngineReady)
        self.batches_applied = 0  # engine batches taken in (tests wait on it, not on wall time)
        self.warm: dict[str, SessionRestored] = {}  # the engine's answer about each pane's saved KV
        self._resident: set[str] = set()  # sessions whose KV the current worker holds
        self._warm_unsupported_said = False
        self._focus_after_restart: str | None = None  # the pane that had focus when ctrl+r was pressed

    # ---- what the workspace asks ----------------------------------------------------------------

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
                self.ws.client.restore_session(pane.session_id, pane.conversation())

    def restart(self) -> None:
        ws = self.ws
        if self.ready and ws.client.alive:
            ws.notify("The engine is running")
            return
        focused = ws.grid.focused_pane()
        self._focus_after_restart = focused.session_id if focused is not None else None
        ws.app.engine_failed(None)
        ws.loading_view.restarting()
        ws.loading_view.display = True
        self.ready = False
        ws.client.restart()
        self.restore_sessions(ws.grid.panes)

    # ---- engine events ------------------------------------------------------------------------

    def apply(self, batch: list[object]) -> None:
        """One engine batch (one step). Only bookkeeping here: panes repaint on the paint tick,
        the panels on their own timers."""
        ws = self.ws
        panel = ws.scheduler_panel
        self.batches_applied += 1
        if ws.serve is not None:
            ws.serve.dispatch(batch)
        for event in batch:
            if isinstance(event, StepReport):
                panel.record(event)
                for update in event.updates:
                    self._route(update, event.t)
                for rejection in event.rejected:
                    ws.notify(rejection.message, title="Request refused", severity="warning")
            elif isinstance(event, SeqUpdate):
                panel.track(event)
                self._route(event)
            elif isinstance(event, LoadProgress):
                ws.loading_view.progress(event)
            elif isinstance(event, EngineReady):
                self._ready(event)
            elif isinstance(event, EngineFailed):
                self._failed(event)
            elif isinstance(event, PolicyChanged):
                self.policy = event.policy
                panel.set_policy(event.policy)
                ws.notify(f"Policy is now {event.policy}")
            elif isinstance(event, SpecChanged):
                panel.set_spec(event.spec)
                ws.notify(f"Speculation is now {event.spec}")
            elif isinstance(event, CommandRejected):
                ws.notify(event.message, severity="warning")
            elif isinstance(event, EndpointsReport):
                panel.record_endpoints(event)
        restored = [e for e in batch if isinstance(e, SessionRestored)]
        if restored:
            self._warm_answers(restored)

    def _route(self, update: SeqUpdate, t: float | None = None) -> None:
        self.ws.agents.runner.take(update)  # an agent's turn waits on it (its pane may be closed)
        pane = self._panes.get(update.session_id)
        if pane is None:
            return
        pane.apply(update)
        self.ws.sequences_panel.apply(update, pane.record.name, t)
        if update.phase is Phase.DONE and update.done_reason in _KEEPS_KV:
            self._resident.add(update.session_id)

    def _warm_answers(self, answers: list[SessionRestored]) -> None:
        ws = self.ws
        panes = self._panes
        for answer in answers:
            self.warm[answer.session_id] = answer
            if answer.outcome is RestoreOutcome.RESTORED:
                self._resident.add(answer.session_id)  # its subagents fork its restored KV
        names = [f"{p.record.name} ({a.tokens:,} tokens)" for a in answers
                 if a.outcome is RestoreOutcome.RESTORED and (p := panes.get(a.session_id))]
        if names:
            ws.notify(f"Restored from disk: {', '.join(names)}; their next replies start from it",
                      title="Warm resume", timeout=5)
        unsupported = next((a for a in answers if a.outcome is RestoreOutcome.UNSUPPORTED), None)
        if unsupported is not None and not self._warm_unsupported_said:
            self._warm_unsupported_said = True
            ws.notify(f"No saved KV to resume from: {unsupported.detail}", title="Warm resume", timeout=5)

    def _ready(self, event: EngineReady) -> None:
        ws = self.ws
        self.ready = True
        ws.app.engine_failed(None)
        self._resident.clear()
        self.policy = event.policy
        self.n_ctx_seq = event.n_ctx  # one unified KV pool: a sequence may use all of it
        for pane in self._panes.values():
            pane.context_size = event.n_ctx
        panel = ws.scheduler_panel
        panel.set_engine(event.model, event.device, event.info.attention)
        panel.set_policy(event.policy)
        panel.set_spec(event.spec)
        ws.loading_view.display = False
        if event.info.template_notice:  # e.g. no chat template: ChatML stands in (template_fallback.py)
            ws.notify(event.info.template_notice, title="Chat template", severity="warning", timeout=20)
        # Give focus back to the pane the user was in when ctrl+r was pressed.
        pane = ws.grid.pane(self._focus_after_restart or "") or ws.grid.focused_pane()
        self._focus_after_restart = None
        if pane is not None:
            ws.grid.focus_pane(pane)

    def _failed(self, event: EngineFailed) -> None:
        ws = self.ws
        self._resident.clear()
        ws.scheduler_panel.engine_stopped()
        # The first failure carries the reason (a load error); the worker's exit comes after it.
        if ws.app.failure is None:
            ws.app.engine_failed(event.message)
        if not self.ready:
            ws.loading_view.failed(event)
            return
        self.ready = False
        hint = " Press ctrl+r to restart it." if event.restartable else ""
        ws.notify(f"{event.message}{hint}", title="Engine stopped", severity="error", timeout=15)
