"""Provides the workspace screen's side of its engine: the batches the app's event pump left in
the screen's inbox, applied to the panes (through the workspace model) and the panels; the rare
events (ready, failed, policy or speculation changed, sessions restored) become messages the
screen handles with `@on`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

from magnitude_tui.engine.events import (
    CommandRejected,
    EndpointsReport,
    EngineFailed,
    EngineReady,
    LoadProgress,
    PolicyChanged,
    RestoreOutcome,
    SeqUpdate,
    SessionRestored,
    SpecChanged,
    StepReport,
)
from magnitude_tui.workspace.pump import PUMP_SLICE_S, Batch, BatchInbox

if TYPE_CHECKING:
    from magnitude_tui.screens.workspace import WorkspaceScreen


class EngineLink:
    """Takes the engine's batches into the workspace screen, a slice at a time."""

    @dataclass
    class Batches(Message):
        """Batches wait in the inbox (posted once until they are taken)."""

    @dataclass
    class Ready(Message):
        event: EngineReady

    @dataclass
    class Failed(Message):
        event: EngineFailed
        was_ready: bool  # it had loaded (a death after the load, not a failed load)

    @dataclass
    class PolicySet(Message):
        policy: str

    @dataclass
    class SpecSet(Message):
        spec: str

    @dataclass
    class Restored(Message):
        names: list[str]  # the panes whose saved KV came back, with their token counts
        unsupported: str | None  # why this engine keeps no saved KV (None: it does)

    def __init__(self, ws: WorkspaceScreen) -> None:
        self.ws = ws
        self.model = ws.model
        self.inbox = BatchInbox(lambda: ws.post_message(EngineLink.Batches()))
        self.batches_applied = 0  # engine batches taken in (tests wait on it, not on wall time)

    def take_batches(self) -> None:
        """Apply what waits, for at most a slice; the rest waits for the next message, so keys
        and paints are handled between slices of a backlog."""
        deadline = time.monotonic() + PUMP_SLICE_S
        while (batch := self.inbox.take()) is not None:
            self.apply(batch)
            if time.monotonic() > deadline:
                self.ws.post_message(EngineLink.Batches())
                return

    def apply(self, batch: Batch) -> None:
        """One engine batch (one step). Only bookkeeping here: panes repaint on the paint tick,
        the panels on their own timers."""
        ws = self.ws
        panel = ws.scheduler_panel
        self.batches_applied += 1
        for event in batch:
            if isinstance(event, StepReport):
                panel.record(event)
                for update in event.updates:
                    self.route(update, event.t)
                for rejection in event.rejected:
                    ws.notify(rejection.message, title="Request refused", severity="warning")
            elif isinstance(event, SeqUpdate):
                panel.track(event)
                self.route(event)
            elif isinstance(event, LoadProgress):
                ws.loading_view.progress(event)
            elif isinstance(event, EngineReady):
                self.model.engine_ready(event)
                ws.post_message(EngineLink.Ready(event))
            elif isinstance(event, EngineFailed):
                ws.post_message(EngineLink.Failed(event, self.model.engine_failed(event)))
            elif isinstance(event, PolicyChanged):
                self.model.policy = event.policy
                ws.post_message(EngineLink.PolicySet(event.policy))
            elif isinstance(event, SpecChanged):
                ws.post_message(EngineLink.SpecSet(event.spec))
            elif isinstance(event, CommandRejected):
                ws.notify(event.message, severity="warning")
            elif isinstance(event, EndpointsReport):
                panel.record_endpoints(event)
        restored = [e for e in batch if isinstance(e, SessionRestored)]
        if restored:
            names = self.model.warm_answers(restored)
            unsupported = next((a.detail for a in restored if a.outcome is RestoreOutcome.UNSUPPORTED), None)
            ws.post_message(EngineLink.Restored(names, unsupported))
        if ws.api_panes is not None:
            ws.api_panes.show_unpaned(batch)

    def route(self, update: SeqUpdate, t: float | None = None) -> None:
        # An agent's turn waits on its updates (its pane may be closed); they come here, with the
        # pane's, so a pane never sees an agent's next request before the last one's end.
        self.ws.agents.runner.take(update)
        pane = self.model.route(update)
        if pane is not None:
            self.ws.sequences_panel.apply(update, pane.record.name, t)

    @staticmethod
    def template_notice(event: EngineReady) -> str | None:
        """Why the chat template is a stand-in (no template in the model file), if it is."""
        return event.info.template_notice
