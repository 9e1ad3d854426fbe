"""Probe findings on agents in panes: closing a pane stops its agent, the approval dialog can stop
the agent, a role's tools survive a relaunch and the agent dialog."""

from __future__ import annotations

import asyncio

from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
from tests.app_support import type_message, wait_for


def slow_command_then_write(request):
    if not tool_results(request):
        return [("run_command", {"command": "sleep 1; touch late.txt"})]
    return [("write_file", {"path": "after.txt", "content": "x"})]


async def test_closing_a_pane_stops_the_agent_running_a_tool_in_it(tmp_path):
    # ctrl+x while the agent's command runs (the pane is between turns, so not "replying"): it
    # used to close at once and leave the agent going: the command finished, the next turn was
    # sent for the closed pane and its write asked for approval.
    (tmp_path / "work").mkdir()
    client = ToolClient(slow_command_then_write)
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent run something slow")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("y")
        await wait_for(pilot, lambda: pane.activity is not None and not pane.activity.approval,
                       what="the command to run")
        await pilot.press("ctrl+x")  # an agent runs: asked first
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the close confirmation")
        assert "running an agent" in app.screen._detail
        await pilot.press("y")
        await wait_for(pilot, lambda: not ws.agents.running(pane), what="the agent to stop")
        await asyncio.sleep(1.3)  # the command would have finished by now
        await pilot.pause()
        assert not (tmp_path / "work" / "late.txt").exists()  # its process group was killed
        assert len(client.submitted) == 1 and not isinstance(app.screen, ApprovalDialog)
        assert pane not in ws.grid.panes
