"""Provides the workspace's command-palette entries: every action the keys reach."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from textual.app import SystemCommand

from magnitude_tui.commands import BURST_DEFAULT, PRESETS
from scheduler.speculation import SpecMode

if TYPE_CHECKING:
    from magnitude_tui.screens.workspace import WorkspaceScreen

# The palette's speculation choices (`--spec`), the default first.
SPEC_CHOICES = (SpecMode.AUTO, SpecMode.NGRAM, SpecMode.DRAFT, SpecMode.OFF)


def palette_commands(screen: "WorkspaceScreen") -> Iterable[SystemCommand]:
    """Every workspace action, so the palette (ctrl+p) reaches what the keys reach."""
    yield SystemCommand("New pane", "Open a new main agent pane (ctrl+n)", screen.action_new_pane)
    yield SystemCommand("Close pane", "Close the focused pane and free its sequence (ctrl+x)",
                        screen.action_close_pane)
    yield SystemCommand("Next pane", "Focus the next pane (tab)", screen.action_next_pane)
    yield SystemCommand("Previous pane", "Focus the previous pane (shift+tab)", screen.action_prev_pane)
    yield SystemCommand("Zoom pane", "Zoom the focused pane / show all panes (ctrl+o)", screen.action_zoom)
    yield SystemCommand("Cancel generation", "Stop the focused pane's reply (esc)", screen.action_cancel)
    yield SystemCommand("Agent task", "Type /agent [ROLE] task in a pane: it runs as an agent with tools",
                        screen.action_agent_hint)
    yield SystemCommand("Tool details", "Unfold (or fold) the focused pane's tool calls: arguments and results (f8)",
                        screen.action_tool_details)
    yield SystemCommand("Spawn subagents", "Fork subagents from the focused pane (ctrl+s)",
                        screen.action_spawn)
    yield SystemCommand(f"Burst spawn {BURST_DEFAULT}", "Spawn subagents all at once (ctrl+b)",
                        screen.action_burst)
    yield SystemCommand("Switch policy", "Choose the scheduling policy (ctrl+l)", screen.action_policy)
    for name, why in PRESETS:
        yield SystemCommand(f"Policy: {name}", why, lambda name=name: screen.switch_policy(name))
    for mode in SPEC_CHOICES:
        yield SystemCommand(f"Speculation: {mode.value}", mode.help, lambda mode=mode: screen.switch_spec(mode))
    yield SystemCommand("Export conversation", "Write the focused pane to Markdown (f5)",
                        screen.action_export)
    yield SystemCommand("Copy last answer", "Copy the focused pane's last reply (ctrl+y)",
                        screen.action_copy_answer)
    yield SystemCommand("Retry reply", "Ask again; the earlier answer is kept to page back to (ctrl+g)",
                        screen.action_retry)
    yield SystemCommand("Earlier answer", "Show the reply's previous answer, kept by retry (alt+left)",
                        lambda: screen.action_page_answer(-1))
    yield SystemCommand("Later answer", "Show the reply's next answer, kept by retry (alt+right)",
                        lambda: screen.action_page_answer(1))
    yield SystemCommand("Agent settings", "Role, system prompt and sampling (temperature, max tokens, top_p, min_p) of the pane (f6)",
                        screen.action_agent_settings)
    yield SystemCommand("Conversations", "Open, reopen, rename, delete or search conversations (f4)",
                        screen.action_conversations)
    yield SystemCommand("Toggle sequences panel", "Per-sequence latency table (f2)",
                        screen.action_toggle_sequences)
    yield SystemCommand("Toggle scheduler panel", "Step time, rows, budget, KV (f3)",
                        screen.action_toggle_scheduler)
    yield SystemCommand("Restart engine", "Start a new engine worker (ctrl+r)", screen.action_restart_engine)
