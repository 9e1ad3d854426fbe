"""Probe findings on agents in panes: closing a pane stops its agent, the approval dialog can stop
the agent, a role's tools survive a relaunch and the agent dialog."""

from __future__ import annotations

import asyncio

from magnitude_tui.agent.policy import ApprovePolicy
from magnitude_tui.agents import AgentSettings
from magnitude_tui.screens.agent_dialog import AgentDialog
from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from scheduler.types import ToolChoiceMode
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


READER = AgentSettings("reader", "You read files.", tools=("read_file",), approve=ApprovePolicy.READ_ONLY,
                       tool_choice=ToolChoiceMode.REQUIRED)


async def test_a_role_keeps_its_tools_after_a_relaunch_and_after_the_agent_dialog(tmp_path):
    # The store keeps a pane's role, system prompt and sampling but not the role's tools, approve
    # and tool_choice, and the agent dialog (f6) built settings without them: a `reader` pane
    # reopened by --resume, or saved in f6, still said `reader` but sent its messages as plain
    # chat, and `/agent` in it was offered every tool (writes and commands included).
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")
    roles = {"reader": READER}

    def script(request):
        return [("read_file", {"path": "r.txt"})] if not tool_results(request) else "read it"

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=roles) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent reader what is in r.txt")
        await drive(pilot, client, lambda: not ws.agents.running(pane) and pane.last_answer(), "the answer")
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.screen, AgentDialog), what="the agent dialog")
        await pilot.press("ctrl+s")  # saved as it is
        await wait_for(pilot, lambda: not isinstance(app.screen, AgentDialog), what="the dialog to close")
        assert pane.record.settings == READER

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=roles, resume=True) as (app, pilot):
        ws = app.workspace
        [pane] = ws.grid.panes
        assert pane.record.settings == READER
        await type_message(pilot, "again please")  # still an agent task, with the role's tools only
        await drive(pilot, client, lambda: client.submitted and not ws.agents.running(pane), "the run")
        first = client.submitted[0]
        assert [t.name for t in first.tools] == ["read_file"]
        assert first.tool_choice.mode is ToolChoiceMode.REQUIRED


async def test_a_reopened_pane_keeps_its_roles_restrictions_when_the_agents_file_lost_the_role(tmp_path):
    # The store kept the role's name but not its tools or approve: with the role gone from the
    # agents file, a reopened `reader` pane ran with every tool (writes and commands asked for).
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")

    def script(request):
        return [("read_file", {"path": "r.txt"})] if not tool_results(request) else "read it"

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles={"reader": READER}) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent reader what is in r.txt")
        await drive(pilot, client, lambda: not app.workspace.agents.running(pane) and pane.last_answer(), "the answer")

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles={}, resume=True) as (app, pilot):
        ws = app.workspace
        [pane] = ws.grid.panes
        assert pane.record.settings == READER
        await type_message(pilot, "again please")
        await drive(pilot, client, lambda: client.submitted and not ws.agents.running(pane), "the run")
        assert [t.name for t in client.submitted[0].tools] == ["read_file"]


async def test_s_in_the_approval_dialog_denies_and_stops_the_agent(tmp_path):
    # A model that calls the same command every turn: the dialog had no way to stop the agent
    # (esc in the pane cannot be reached under the modal dialog), so each of up to max_turns
    # turns took a denial.
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("run_command", {"command": "touch ran.txt"})])
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent loop forever")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("s")
        await wait_for(pilot, lambda: not ws.agents.running(pane), what="the agent to stop")
        for _ in range(5):
            if client.live:
                client.step()
            await pilot.pause()
        assert not isinstance(app.screen, ApprovalDialog) and len(client.submitted) == 1
        assert not (tmp_path / "work" / "ran.txt").exists()
        assert pane.activity is None and app.screen is ws
        await type_message(pilot, "/agent once more")  # the pane takes a new task
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the next approval")


async def test_s_in_a_subagents_approval_stops_the_pane_agent_that_spawned_it(tmp_path):
    (tmp_path / "work").mkdir()

    def script(request):
        if request.session_id.count("-") > 1 or "Your task:" in request.messages[-1].content:
            return [("run_command", {"command": "touch child.txt"})]
        return [("spawn_agents", {"agents": [{"task": "alpha"}]})]

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent split the work")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the subagent's approval")
        assert app.screen.request.parent == "A1"
        await pilot.press("s")
        await wait_for(pilot, lambda: not ws.agents.running(pane), what="the agent to stop")
        assert not (tmp_path / "work" / "child.txt").exists()
        assert not isinstance(app.screen, ApprovalDialog)


async def test_retry_and_edit_wait_while_an_agent_runs_a_tool(tmp_path):
    # Between an agent's turns (its command running) the pane is not "replying": ctrl+g used to
    # cut the conversation and send a plain chat turn on the agent's session beside the agent's
    # own next turn, and up + enter did the same with an edited message.
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("run_command", {"command": "sleep 1"})] if not tool_results(r) else "done")
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent wait a moment")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("y")
        await wait_for(pilot, lambda: pane.activity is not None and not pane.activity.approval,
                       what="the command to run")
        messages = list(pane.record.messages)
        await pilot.press("ctrl+g")
        await pilot.press("up")
        await pilot.pause()
        assert pane.editing is None and not pane.composer.text  # nothing to edit while it runs
        assert len(client.submitted) == 1 and pane.record.messages == messages
        await drive(pilot, client, lambda: not ws.agents.running(pane), "the agent's answer")
        assert [r.tools != () for r in client.submitted[:2]] == [True, True]
        assert pane.last_answer() == "done"


async def test_a_question_whose_agent_stopped_under_another_screen_is_gone_when_uncovered(tmp_path):
    # The dialog could only dismiss itself as the top screen: an agent stopped while another
    # screen lay over its question left the question on the stack, to come back for no one.
    from textual.screen import ModalScreen

    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("run_command", {"command": "touch ran.txt"})])
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent run it")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        cover = ModalScreen()
        await app.push_screen(cover)
        assert ws.agents.stop(pane)
        await wait_for(pilot, lambda: not ws.agents.running(pane), what="the agent to stop")
        assert app.screen is cover
        app.pop_screen()
        await wait_for(pilot, lambda: not any(isinstance(s, ApprovalDialog) for s in app.screen_stack),
                       what="the stale question to go")
        assert not (tmp_path / "work" / "ran.txt").exists()
