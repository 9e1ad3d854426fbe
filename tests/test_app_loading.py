"""The per-sequence `loading` phase: a message sent while the model loads shows `loading` with the
load's progress in its pane, and runs once the engine is ready."""

from __future__ import annotations

from magnitude_tui.widgets.status_line import StatusLine
from scheduler.types import DoneReason, Phase
from tests.app_support import SIZE, ScriptedClient, make_app, settle, wait_for


async def test_a_message_sent_while_the_model_loads_shows_loading_then_runs(tmp_path):
    client = ScriptedClient(auto_ready=False)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        assert ws.loading_view.display and not ws.engine_ready
        await pilot.press(*"hello", "enter")  # the panes take input while the model loads
        await settle(pilot)
        pane = ws.grid.panes[0]
        assert pane.busy and pane.replies.last_update.phase is Phase.LOADING
        metrics = StatusLine.metrics_text(pane.replies.last_update)
        assert "model 40% loaded" in metrics and "runs when the engine is ready" in metrics
        client.load_progress(0.75)
        await settle(pilot)
        assert "model 75% loaded" in StatusLine.metrics_text(pane.replies.last_update)
        assert client.submitted and not client.step_no  # nothing ran yet
        client.ready()
        await wait_for(pilot, lambda: ws.engine_ready, what="EngineReady")
        assert not ws.loading_view.display
        client.run_to_completion()
        await settle(pilot)
        assert pane.replies.last_update.phase is Phase.DONE and pane.replies.last_update.done_reason is DoneReason.STOP
        assert "hello" in pane.last_answer()
