"""Provides the slash commands typed in a composer and the workspace's command-palette entries."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from textual.app import SystemCommand

from magnitude_tui.agents import unknown_role
from magnitude_tui.screens.policy_dialog import PRESETS, policy_problem

from scheduler.speculation import SpecMode

# The palette's speculation choices (`--spec`), the default first.
SPEC_CHOICES = (SpecMode.AUTO, SpecMode.NGRAM, SpecMode.DRAFT, SpecMode.OFF)
from magnitude_tui.widgets.pane_grid import MAX_SUBAGENTS

if TYPE_CHECKING:
    from magnitude_tui.screens.workspace import WorkspaceScreen

BURST_DEFAULT = 8

SLASH_HELP = (
    "/agent [ROLE] task — this pane runs the task as an agent with tools (read, search, edit, run; "
    "writes and commands ask first) · "
    "/spawn [ROLE] N task — N subagents (with a role from agents.toml) fork this conversation and "
    "report back · "
    "/burst [N] — N subagents at once · /policy P — prefill-first | fixed:N | target:MS · "
    "/retry · /export · /copy · /raw — this pane completes its text as is, no chat template "
    "(base models)"
)


@dataclass(frozen=True)
class Slash:
    """A parsed slash command."""

    name: str  # agent | spawn | burst | policy | export | copy | retry | raw | help
    count: int = 0
    arg: str = ""
    role: str | None = None


class UnknownRole(ValueError):
    """/spawn was given a role name that agents.toml does not define."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        super().__init__(unknown_role(name, known))


def parse_slash(text: str, roles: Iterable[str] = ()) -> Slash:
    """Parse '/name args'; raises ValueError with a message meant for the user. `roles` are the
    agent names /spawn accepts before its count."""
    name, _, rest = text[1:].strip().partition(" ")
    name, rest = name.lower(), rest.strip()
    if name == "spawn":
        known = list(roles)
        head, _, tail = rest.partition(" ")
        role = None
        if head in known:
            role, rest = head, tail.strip()
            head, _, tail = rest.partition(" ")
        elif not head.isdigit() and (tail.partition(" ")[0].isdigit()
                                     or difflib.get_close_matches(head, known, n=1, cutoff=0.75)):
            # "/spawn critc 2 task": a word before the count is meant as a role (and one a typo
            # away from a role is one); taken as the task it would spawn the wrong thing silently.
            raise UnknownRole(head, known)
        count, task = (int(head), tail.strip()) if head.isdigit() else (1, rest)
        if not task:
            raise ValueError("usage: /spawn [ROLE] N task")
        if not 1 <= count <= MAX_SUBAGENTS:
            raise ValueError(f"spawn between 1 and {MAX_SUBAGENTS} subagents")
        return Slash("spawn", count, task, role)
    if name == "agent":
        known = list(roles)
        head, _, tail = rest.partition(" ")
        role = head if head in known else None
        task = tail.strip() if role is not None else rest
        if not task:
            raise ValueError("usage: /agent [ROLE] task")
        return Slash("agent", arg=task, role=role)
    if name == "burst":
        if rest and not rest.isdigit():
            raise ValueError("usage: /burst [N]")
        count = int(rest) if rest else BURST_DEFAULT
        if not 1 <= count <= MAX_SUBAGENTS:
            raise ValueError(f"burst between 1 and {MAX_SUBAGENTS} subagents")
        return Slash("burst", count)
    if name == "policy":
        problem = policy_problem(rest)
        if problem:
            raise ValueError(problem)
        return Slash("policy", arg=rest)
    if name in ("export", "copy", "retry", "help", "raw"):
        return Slash(name)
    raise ValueError(f"unknown command /{name}; {SLASH_HELP}")


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
