"""Provides ToolTurnView: an agent's tool turn in a pane's transcript. A tool result shows as its
call's compact block (live, and again when the conversation is reopened); a turn that only called
tools has no text of its own, so it takes no room (its calls show with their results)."""

from __future__ import annotations

import json

from textual.app import ComposeResult

from magnitude_tui.agent.team import SPAWN
from magnitude_tui.records import MessageRecord
from magnitude_tui.widgets.message_view import MessageView
from magnitude_tui.widgets.tool_block import ToolBlock


class ToolTurnView(MessageView):
    DEFAULT_CSS = """
    ToolTurnView { height: auto; padding: 0; }
    ToolTurnView.-calls-only { display: none; }
    """

    def __init__(self, message: MessageRecord, *, speaker: str, panes: tuple[str, ...] = ()) -> None:
        super().__init__(message, speaker=speaker)
        self.set_class(message.call is None, "-calls-only")
        call = message.call
        self.block = None if call is None else ToolBlock(
            speaker, call.name, call.arguments, message.duration_s, message.content, message.ok,
            panes=panes or answered_by(call.name, message.content), approval_wait_s=message.approval_wait_s)

    def compose(self) -> ComposeResult:
        if self.block is not None:
            yield self.block


def answered_by(tool: str, result: str) -> tuple[str, ...]:
    """spawn_agents' result names the subagents that answered (their panes' names are only known
    while the session that opened them runs)."""
    if tool != SPAWN:
        return ()
    try:
        entries = json.loads(result)
    except ValueError:
        return ()
    if not isinstance(entries, list):
        return ()
    return tuple(e["agent"] for e in entries if isinstance(e, dict) and isinstance(e.get("agent"), str))
