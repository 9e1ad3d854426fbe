"""Probe findings on agent panes used from the keyboard in a terminal: what a tool's output may
do to the screen, and how a keyboard-only user reaches a tool block."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal

import pytest
from textual.geometry import Region

from magnitude_tui.app import MagnitudeApp
from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.store import Store
from magnitude_tui.widgets.tool_block import ToolBlock
from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
from tests.app_support import settle, type_message, wait_for

# What a terminal acts on: C0 controls but tab and newline, DEL, C1 (0x9b is CSI), bidi overrides.
TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
ESCAPES = "printf 'red \\033[31mX\\033[0m \\033[2J\\033[H wiped \\033]0;TITLE\\007 \\342\\200\\256evil\\n'"


def drawn(widget) -> str:
    """The text of every cell the widget draws (what goes to the terminal)."""
    return "".join(seg.text for y in range(widget.size.height) for seg in widget.render_line(y))


async def test_a_commands_escape_sequences_are_shown_not_sent_to_the_terminal(tmp_path):
    # Unfolding a run_command block wrote the command's output to the screen as it was: an
    # `\x1b[2J\x1b[H` in it (a `clear`, a colored `ls`, pytest's colors) cleared the terminal and
    # moved the cursor over the app, and an OSC set the window title (seen in tmux). The dialog
    # and `run` already showed such bytes as escapes; the block now does too.
    (tmp_path / "work").mkdir()

    def script(request):
        return [("run_command", {"command": ESCAPES})] if not tool_results(request) else "done"

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent print something colourful")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("y")
        await drive(pilot, client, lambda: pane.last_answer() == "done", "the answer")
        await settle(pilot)
        [block] = pane.query(ToolBlock)
        assert "\x1b" in block.result  # the output as the model read it
        await pilot.click(block)
        await pilot.pause()
        assert block.unfolded
        text = drawn(block)
        assert "wiped" in text and "\\x1b[2J" in text and "\\u202e" in text
        assert not TERMINAL_CONTROLS.search(text), repr(TERMINAL_CONTROLS.search(text))


def spawn_two_sleepers(request):
    last = request.messages[-1]
    if last.role == "user" and "Your task:" in last.content:
        task = last.content.split("Your task: ")[1].split("\n")[0]
        return [("run_command", {"command": f"sleep 3; touch {task}.txt"})]
    if request.messages[-1].role == "tool" and "Your task:" in "".join(m.content for m in request.messages):
        return "child done"
    return [("spawn_agents", {"agents": [{"task": "one"}, {"task": "two"}]})] if not tool_results(request) \
        else "merged " + tool_results(request)[0]


async def test_closing_a_subagents_pane_stops_that_subagent_alone(tmp_path):
    # ctrl+x on a spawn_agents subagent's pane while its command ran closed the pane at once and
    # left the subagent going unseen (found in tmux): its command finished and wrote, its next
    # turn was sent for the closed pane's session, and its answer went back to the parent as if
    # nothing had happened. Now it asks first (as for a pane agent), and closing stops that
    # subagent (its command's process group killed); its sibling and the parent carry on, and
    # the parent reads that it was stopped.
    (tmp_path / "work").mkdir()
    client = ToolClient(spawn_two_sleepers)
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        await type_message(pilot, "/agent split the work")
        await drive(pilot, client, lambda: len(ws.grid.panes) == 3, "the subagents' panes")
        parent, one, two = ws.grid.panes
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the first approval")
        await pilot.press("a")  # one: run_command allowed for its pane
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the second approval")
        await pilot.press("a")
        await wait_for(pilot, lambda: one.activity is not None and not one.activity.approval
                       and two.activity is not None and not two.activity.approval, what="both commands to run")
        assert ws.agents.running(one)  # ctrl+x asks first, as for the pane that runs the agent
        ws.focus_pane(one)
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the close confirmation")
        assert "running an agent" in app.screen._detail
        await pilot.press("y")
        await wait_for(pilot, lambda: one not in ws.grid.panes, what="the pane to close")
        # A message typed into a running subagent's pane waits for it (it was sent at once, a
        # second request on the subagent's session beside its own loop's).
        ws.focus_pane(two)
        await type_message(pilot, "hello two")
        assert two.queued == ["hello two"]
        assert not [r for r in client.submitted if r.messages[-1].content == "hello two"]
        await drive(pilot, client, lambda: (parent.last_answer() or "").startswith("merged")
                    and not ws.agents.running(parent), "the merged answer")
        assert (tmp_path / "work" / "two.txt").exists()
        assert not (tmp_path / "work" / "one.txt").exists()  # its process group was killed
        entries = json.loads(parent.last_answer()[len("merged "):])
        assert [(e["task"], e["ended"]) for e in entries] == [("one", "cancelled"), ("two", "answered")]
        assert "stopped" in entries[0]["error"]
        # The subagents are done: what was typed into two's pane is sent now, as its next turn.
        await drive(pilot, client, lambda: any(r.messages[-1].content == "hello two" for r in client.submitted),
                    "the queued message")
        [sent] = [r for r in client.submitted if r.messages[-1].content == "hello two"]
        assert sent.session_id == two.session_id and not two.queued
        # Nothing was sent for the closed pane's session after it closed.
        assert not [r for r in client.submitted if r.session_id == one.session_id
                    and r is not client.submitted[0] and len(tool_results(r)) > 0]


async def test_f8_unfolds_and_folds_the_focused_panes_tool_blocks_from_the_keyboard(tmp_path):
    # A tool block unfolded only on a click (or enter once focused), and nothing gave it the
    # focus from the keyboard: tab and shift+tab move between panes, and the composer holds the
    # focus. A keyboard-only user could not see a call's arguments or result. f8 (and the
    # palette's "Tool details") now unfolds every tool block of the focused pane, and again folds
    # them (f7 is the composer's select-all).
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside the file\n")

    def script(request):
        if len(tool_results(request)) < 2:
            return [("read_file", {"path": "r.txt"})]
        return "read twice"

    client = ToolClient(script)
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent read it")
        await drive(pilot, client, lambda: pane.last_answer() == "read twice", "the answer")
        await settle(pilot)
        blocks = list(pane.query(ToolBlock))
        assert len(blocks) == 2 and not any(b.unfolded for b in blocks)
        await pilot.press("f8")
        await pilot.pause()
        assert all(b.unfolded for b in blocks)
        assert "inside the file" in drawn(blocks[0])
        assert app.focused is pane.query_one("Composer")  # typing goes on where it was
        await pilot.press("f8")
        await pilot.pause()
        assert not any(b.unfolded for b in blocks)
        titles = {c.title for c in app.get_system_commands(app.workspace)}
        assert "Tool details" in titles


def write_long_file(request):
    if not tool_results(request):
        return [("write_file", {"path": "long.txt", "content": "".join(f"line {i}\n" for i in range(40))})]
    return "written"


@pytest.mark.parametrize("size", [(80, 24), (60, 15), (100, 30)])
async def test_the_approval_dialog_fits_a_small_terminal_and_its_diff_scrolls_into_view(tmp_path, size):
    # In an 80x24 (or a 60x15) terminal the dialog was cut at 90% of the screen: a 40-line
    # write's arguments (up to 20 rows) and diff (another 20) pushed the diff, the key hints and
    # the buttons off the screen, so what was being allowed could not be seen (y still allowed
    # it). Now the arguments and the diff scroll in one body that shrinks to what the screen
    # leaves, and the hints and buttons stay at the dialog's foot.
    (tmp_path / "work").mkdir()
    client = ToolClient(write_long_file)
    app = MagnitudeApp(client=client, store=Store(tmp_path / "magnitude.db"), export_dir=tmp_path / "exports",
                       workdir=tmp_path / "work")
    async with app.run_test(size=size) as pilot:
        await type_message(pilot, "/agent write a long file")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.pause()
        dialog = app.screen
        screen_region = Region(0, 0, *size)
        for wid in ("#approval-stop", "#approval-deny", "#approval-pane", "#approval-once"):
            button = dialog.query_one(wid)
            r = button.region
            assert screen_region.contains_region(r), (wid, r)
            # Whole, not clipped by the dialog: its first and last columns are the button's.
            assert dialog.get_widget_at(r.x, r.y)[0] is button and dialog.get_widget_at(r.right - 1, r.y)[0] is button
        body = dialog.query_one("#approval-body")
        assert body.max_scroll_y > 0  # it scrolls
        body.focus()  # tab reaches it; its keys scroll it
        await pilot.press("end")
        await pilot.pause()
        diff = dialog.query_one("#approval-diff")
        bottom = diff.region.bottom - 1
        assert body.region.y <= bottom < body.region.bottom
        assert "+line 39" in drawn(diff)
        await pilot.press("y")
        await drive(pilot, client, lambda: (tmp_path / "work" / "long.txt").exists(), "the write")


def slow_command(request):
    return [("run_command", {"command": "sleep 2; touch late.txt"})] if not tool_results(request) else "done"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
async def test_a_hangup_or_term_ends_the_app_and_the_command_it_runs(tmp_path, sig):
    # Closing the terminal (SIGHUP: a tmux kill, an ssh drop) or `kill` (SIGTERM) while an
    # agent's approved command ran killed the app outright: the command, in a process group of
    # its own that the signal does not reach, ran on and wrote late.txt after the app was gone
    # (seen in tmux), and the app's unmount (store save, MCP servers) never ran. The app now
    # takes both signals and ends as ctrl+q does (exit code 128 + the signal).
    (tmp_path / "work").mkdir()
    client = ToolClient(slow_command)
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent run something slow")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("y")
        await wait_for(pilot, lambda: pane.activity is not None and not pane.activity.approval,
                       what="the command to run")
        # Without a handler the signal would end the test run itself.
        assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), sig)
        await wait_for(pilot, lambda: app.return_code is not None, what="the app to end")
    assert app.return_code == 128 + sig
    assert signal.getsignal(sig) is signal.SIG_DFL  # given back
    await asyncio.sleep(2.5)  # the command would have finished by now
    assert not (tmp_path / "work" / "late.txt").exists()


async def test_stopping_the_parent_agent_clears_its_subagents_tool_phase(tmp_path):
    # esc on the pane that spawned subagents stopped them (their commands killed), but their
    # panes went on showing "TOOL run_command · running · 31 s" and the sequences panel
    # "tool 31s", counting for ever (seen in tmux): only the parent's pane was cleared.
    (tmp_path / "work").mkdir()
    client = ToolClient(spawn_two_sleepers)
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        await type_message(pilot, "/agent split the work")
        await drive(pilot, client, lambda: len(ws.grid.panes) == 3, "the subagents' panes")
        parent, one, two = ws.grid.panes
        for _ in range(2):
            await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "an approval")
            await pilot.press("y")
        await wait_for(pilot, lambda: one.activity is not None and two.activity is not None
                       and not one.activity.approval and not two.activity.approval, what="both commands to run")
        ws.focus_pane(parent)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not ws.agents.running(parent), what="the agent to stop")
        await pilot.pause()
        assert one.activity is None and two.activity is None
        assert not ws.sequences_panel._tools
        assert not ws.agents.running(one) and not ws.agents.running(two)
