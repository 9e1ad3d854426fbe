"""Provides the slash commands typed in a composer (the palette's entries are in screens/palette.py)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable

from magnitude_tui.agents import unknown_role
from magnitude_tui.workspace.limits import MAX_SUBAGENTS
from scheduler.budget import parse_policy

BURST_DEFAULT = 8

PRESETS = (
    ("target:25", "chunked prefill, 25 ms target step (snappy decode)"),
    ("target:50", "chunked prefill, 50 ms target step (default)"),
    ("target:100", "chunked prefill, 100 ms target step"),
    ("fixed:16", "chunked prefill, 16 rows per step"),
    ("fixed:64", "chunked prefill, 64 rows per step"),
    ("fixed:512", "chunked prefill, 512 rows per step (llama.cpp -ub default)"),
    ("prefill-first", "whole prompt in one step; running sequences freeze"),
)


def policy_problem(policy: str) -> str | None:
    """Why the engine would reject this policy (None: it is valid). The engine's own parser
    decides, so the dialog, the slash command and the engine agree on every string."""
    try:
        parse_policy(policy.strip())
    except ValueError as exc:
        return str(exc)
    return None


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
