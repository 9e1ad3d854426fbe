"""Probe findings on agent panes used from the keyboard in a terminal: what a tool's output may
do to the screen, and how a keyboard-only user reaches a tool block."""

from __future__ import annotations

import re

from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.widgets.tool_block import ToolBlock
from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
from tests.app_support import settle, type_message

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
