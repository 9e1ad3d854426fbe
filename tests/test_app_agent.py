"""Pilot tests of agents in panes: /agent, the approval dialog (allow once, allow for the pane, deny with a reason), the tool phase, tool blocks."""

from __future__ import annotations

import json
import time

import pytest

from magnitude_tui.agent.policy import ApprovePolicy, Verdict
from magnitude_tui.agents import AgentSettings
from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.widgets.status_line import StatusLine
from magnitude_tui.widgets.tool_block import ToolBlock
from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
from tests.app_support import settle, type_message, wait_for


def edit_twice(request):
    """Two edits (one per turn), then an answer that quotes what the tools said."""
    results = tool_results(request)
    if len(results) == 0:
        return [("edit_file", {"path": "a.txt", "old_text": "hello", "new_text": "bye"})]
    if len(results) == 1:
        return [("edit_file", {"path": "a.txt", "old_text": "bye", "new_text": "ciao"})]
    return "finished after " + " | ".join(results)


async def test_allow_once_asks_each_time_and_shows_the_diff(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "a.txt").write_text("hello\n")
    client = ToolClient(edit_twice)
    async with agent_app(tmp_path, client) as (app, pilot):
        await type_message(pilot, "/agent change the greeting")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the first approval")
        dialog = app.screen
        assert dialog.request.tool == "edit_file" and dialog.request.agent == "A1"
        assert dialog.request.parent is None
        assert "-hello" in str(dialog.query_one("#approval-diff").render())
        assert '"new_text": "bye"' in str(dialog.query_one("#approval-args").render())
        await pilot.press("y")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the second approval")
        await pilot.press("y")
        await drive(pilot, client, lambda: "finished after" in (app.workspace.grid.panes[0].last_answer() or ""),
                    "the answer")
        assert (tmp_path / "work" / "a.txt").read_text() == "ciao\n"
        await settle(pilot)
        blocks = list(app.workspace.grid.panes[0].query(ToolBlock))
        assert [b.tool for b in blocks] == ["edit_file", "edit_file"] and all(b.ok for b in blocks)
        assert "edit_file(" in blocks[0].summary() and "chars" in blocks[0].summary()
        await pilot.click(blocks[0])  # unfolds: the whole arguments and the result (the diff)
        assert blocks[0].unfolded and "+bye" in str(blocks[0].render())


async def test_allow_for_the_pane_asks_once(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "a.txt").write_text("hello\n")
    client = ToolClient(edit_twice)
    async with agent_app(tmp_path, client) as (app, pilot):
        asked = []
        await type_message(pilot, "/agent change the greeting")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        asked.append(app.screen.request.tool)
        await pilot.press("a")
        await drive(pilot, client, lambda: "finished after" in (app.workspace.grid.panes[0].last_answer() or ""),
                    "the answer", on_dialog=lambda: asked.append("again"))
        assert asked == ["edit_file"]
        assert (tmp_path / "work" / "a.txt").read_text() == "ciao\n"


async def test_deny_with_a_reason_reaches_the_model(tmp_path):
    (tmp_path / "work").mkdir()

    def script(request):
        results = tool_results(request)
        if not results:
            return [("run_command", {"command": "rm -rf build"})]
        return f"ok: {results[0]}"

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        await type_message(pilot, "/agent clean up")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("n")
        await pilot.press(*"keep the build", "enter")
        await drive(pilot, client, lambda: "ok:" in (app.workspace.grid.panes[0].last_answer() or ""), "the answer")
        last = client.submitted[-1]
        tool_message = [m for m in last.messages if m.role == "tool"][-1]
        assert tool_message.content == "denied: keep the build"
        await settle(pilot)
        [block] = app.workspace.grid.panes[0].query(ToolBlock)
        assert not block.ok and block.tool == "run_command"


@pytest.mark.serial
async def test_tool_phase_shown_while_waiting_on_approval(tmp_path):
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("write_file", {"path": "n.txt", "content": "x"})] if not tool_results(r)
                        else "written")
    async with agent_app(tmp_path, client) as (app, pilot):
        await type_message(pilot, "/agent write it")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        ws = app.workspace
        pane = ws.grid.panes[0]
        assert pane.activity is not None and pane.activity.tool == "write_file" and pane.activity.approval
        await pilot.pause(0.15)  # a paint tick
        badge = pane.query_one(StatusLine).query_one(".badge")
        assert str(badge.render()) == "TOOL"
        assert "write_file · approval" in str(pane.query_one(StatusLine).query_one(".metrics").render())
        ws.sequences_panel.display = True
        ws.sequences_panel.refresh_rows()
        cells = ws.sequences_panel._cells(ws.sequences_panel._rows[pane.session_id],
                                          ws.sequences_panel._tools.get(pane.session_id))
        assert cells[3].plain.startswith("tool?") and "write_file"[:3] in cells[3].plain
        await pilot.press("y")
        await drive(pilot, client, lambda: pane.last_answer() == "written", "the answer")
        assert pane.activity is None and pane.session_id not in ws.sequences_panel._tools


async def test_esc_denies_and_a_read_runs_without_asking(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("readable\n")

    def script(request):
        results = tool_results(request)
        if not results:
            return [("read_file", {"path": "r.txt"})]
        if len(results) == 1:
            return [("write_file", {"path": "w.txt", "content": "no"})]
        return "done: " + results[1]

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        await type_message(pilot, "/agent look")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        assert app.screen.request.tool == "write_file"  # the read did not ask
        await pilot.press("escape")
        pane = app.workspace.grid.panes[0]
        await drive(pilot, client, lambda: (pane.last_answer() or "").startswith("done:")
                    and not app.workspace.agents.running(pane), "the answer")
        assert pane.last_answer() == "done: denied: the user said no"
        assert not (tmp_path / "work" / "w.txt").exists()


@pytest.mark.serial
async def test_a_tool_blocks_duration_is_its_run_time_not_the_time_the_dialog_was_open(tmp_path):
    # A denied write_file read "✗ write_file(...) · 1.2 s": the person's time at the dialog was
    # counted as the tool's. Neither a denied nor an allowed call counts it now.
    (tmp_path / "work").mkdir()

    def script(request):
        results = tool_results(request)
        if len(results) < 2:
            return [("write_file", {"path": f"w{len(results)}.txt", "content": "x"})]
        return "done"

    client = ToolClient(script)
    think_s = 1.2
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent write")
        for key in ("n", "y"):  # the first denied, the second allowed, each after a while
            await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
            shown = time.monotonic()
            await pilot.pause(think_s)
            if key == "n":
                await pilot.press("escape")
            else:
                await pilot.press("y")
            assert time.monotonic() - shown >= think_s
        await drive(pilot, client, lambda: pane.last_answer() == "done", "the answer")
        await settle(pilot)
        denied, allowed = pane.query(ToolBlock)
        assert not denied.ok and allowed.ok and (tmp_path / "work" / "w1.txt").exists()
        for block in (denied, allowed):
            assert block.duration_s < think_s / 2, block.summary()
            assert " · 0.0 s · " in block.summary() or " · 0.1 s · " in block.summary()


def test_a_tool_block_says_the_wait_for_approval_apart_from_the_run_time():
    asked = ToolBlock("A1", "write_file", '{"path": "w.txt"}', 0.01, "denied: no", False, approval_wait_s=42.0)
    assert " · 0.0 s · waited 42.0 s for approval · 10 chars" in asked.summary()
    unasked = ToolBlock("A1", "read_file", '{"path": "r.txt"}', 0.01, "text", True)
    assert "waited" not in unasked.summary() and unasked.summary().endswith(" · 0.0 s · 4 chars")


def test_approval_verdicts_are_the_core_ones():
    assert {v.value for v in Verdict} == {"allow_once", "allow_pane", "deny"}


async def test_spawn_agents_opens_subagent_panes(tmp_path):
    (tmp_path / "work").mkdir()

    def script(request):
        last = request.messages[-1].content
        if "Your task:" in last and request.messages[-1].role == "user":
            return "child answer " + last.split("Your task: ")[1].split("\n")[0]
        results = tool_results(request)
        if not results:
            return [("spawn_agents", {"agents": [{"task": "alpha"}, {"task": "beta"}]})]
        return "merged " + str(len(json.loads(results[0])))

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        await type_message(pilot, "/agent split the work")
        ws = app.workspace
        await drive(pilot, client, lambda: (ws.grid.panes[0].last_answer() or "").startswith("merged")
                    and not ws.agents.running(ws.grid.panes[0]), "the merged answer")
        await settle(pilot)
        names = [p.record.name for p in ws.grid.panes]
        assert names == ["A1", "A1.1", "A1.2"]
        children = ws.grid.panes[1:]
        assert [c.record.task for c in children] == ["alpha", "beta"]
        assert all(c.record.role == "subagent" and c.record.parent_id == ws.grid.panes[0].session_id
                   for c in children)
        assert [c.last_answer() for c in children] == ["child answer alpha", "child answer beta"]
        [block] = ws.grid.panes[0].query(ToolBlock)
        assert block.panes == ("A1.1", "A1.2") and "answers from A1.1, A1.2" in block.summary()
        # Their answers went back as the tool result, not as messages posted to the parent.
        assert not [m for m in ws.grid.panes[0].record.messages if m.author]
        assert ws.grid.panes[0].last_answer() == "merged 2"


def test_agent_command_parses_an_optional_role():
    from magnitude_tui.commands import parse_slash

    assert parse_slash("/agent fix it", ["coder"]) == parse_slash("/agent fix it")
    command = parse_slash("/agent coder fix the bug", ["coder"])
    assert (command.name, command.role, command.arg) == ("agent", "coder", "fix the bug")
    assert parse_slash("/agent fix it").role is None
    with pytest.raises(ValueError, match="usage: /agent"):
        parse_slash("/agent", ["coder"])
    with pytest.raises(ValueError, match="usage: /agent"):
        parse_slash("/agent coder", ["coder"])


async def test_a_role_with_tools_runs_each_message_as_an_agent(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")
    roles = {"reader": AgentSettings("reader", "You read files.", tools=("read_file",),
                                     approve=ApprovePolicy.READ_ONLY)}
    def script(request):
        # The results since the task (the pane's history carries the earlier runs' tool turns).
        last_task = max(i for i, m in enumerate(request.messages) if m.role == "user")
        results = [m.content for m in request.messages[last_task:] if m.role == "tool"]
        return [("read_file", {"path": "r.txt"})] if not results else "it says " + results[0].strip()

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=roles) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent reader what is in r.txt")
        await drive(pilot, client, lambda: not ws.agents.running(pane) and pane.last_answer(), "the answer")
        first = client.submitted[0]
        assert first.messages[0].content == "You read files."
        assert [t.name for t in first.tools] == ["read_file"]
        assert pane.record.settings.role == "reader" and "inside" in pane.last_answer()
        # From now on a plain message is an agent task too (the pane's role names tools).
        before = len(client.submitted)
        await type_message(pilot, "and again")
        await drive(pilot, client, lambda: len(client.submitted) >= before + 2 and not ws.agents.running(pane),
                    "the second run")
        assert client.submitted[before].tools and client.submitted[before].messages[-1].content == "and again"
        # ...and it carries the first run's tool turn (kept by the pane since 01be6f8).
        assert [m.role for m in client.submitted[before].messages].count("tool") == 1


async def test_esc_stops_an_agent_waiting_on_approval(tmp_path):
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("run_command", {"command": "true"})])
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent loop forever")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        ws.action_cancel()  # esc in the workspace (the dialog would take the key itself)
        await wait_for(pilot, lambda: not ws.agents.running(pane) and not isinstance(app.screen, ApprovalDialog),
                       what="the agent to stop")
        assert pane.activity is None


def test_workdir_option_reaches_the_app(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import magnitude_tui.app
    from magnitude_tui.cli import app as cli
    from tests.test_cli_preflight import tiny_gguf

    seen = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: seen.append(kw))
    model = str(tiny_gguf(tmp_path / "tiny.gguf"))
    result = CliRunner().invoke(cli, ["--model", model, "--workdir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen[0]["workdir"] == tmp_path.resolve()


async def test_an_agents_file_brings_its_mcp_servers_and_spawn_limits_to_the_panes(tmp_path):
    # agents.toml names a stdio MCP server and caps spawn_agents at one subagent per call: the
    # pane's agent calls the server's tool and is refused a burst of two, as a headless run is.
    import sys

    from magnitude_tui.agents import RoleBook
    from tests.test_agent_mcp import SERVER

    (tmp_path / "work").mkdir()
    path = tmp_path / "agents.toml"
    path.write_text(f'[shouter]\nsystem = "You shout."\ntools = ["mcp.test", "spawn_agents"]\n\n'
                    f'[mcp.test]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(SERVER)}]\n\n'
                    '[spawn]\nmax_per_call = 1\n')

    def script(request):
        results = tool_results(request)
        if not results:
            return [("test__shout", {"text": "hello"}),
                    ("spawn_agents", {"agents": [{"task": "a"}, {"task": "b"}]})]
        return "heard " + " | ".join(results)

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=RoleBook(path)) as (app, pilot):
        await type_message(pilot, "/agent shouter say hello")
        pane = app.workspace.grid.panes[0]
        await drive(pilot, client, lambda: "heard" in (pane.last_answer() or "")
                    and not app.workspace.agents.running(pane), "the answer", on_dialog=lambda: None)
        answer = pane.last_answer()
        assert "HELLO!" in answer
        assert "max_per_call" in answer  # the burst of two was refused by the file's limit
        blocks = list(pane.query(ToolBlock))
        assert [b.tool for b in blocks][:1] == ["test__shout"] and blocks[0].ok
        agents = app.workspace.agents
        assert agents._mcp is not None and agents._mcp.problems == {}
    assert agents._mcp is None  # the server was stopped with the app
