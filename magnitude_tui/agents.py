"""Provides agent settings: a pane's system prompt and sampling, and the named agent definitions
(roles) read from agents.toml in the config directory.

    # ~/.config/magnitude-tui/agents.toml
    [critic]
    system = "You look for the weakest point of a plan and say it in two sentences."
    temperature = 0.3
    max_tokens = 200
    top_p = 0.9      # nucleus sampling (0 < top_p <= 1)
    min_p = 0.05     # drop tokens below this share of the likeliest one (0 <= min_p < 1)
"""

from __future__ import annotations

import difflib
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import platformdirs

from magnitude_tui.agent.policy import ApprovePolicy
from scheduler.types import SamplingParams, ToolChoiceMode

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

_KEYS = {"system", "temperature", "max_tokens", "top_p", "min_p", "tools", "approve", "tool_choice"}
# Top-level tables that are not roles: MCP servers, subagent limits, run_command's environment
# (magnitude_tui/agent/config.py).
RESERVED_TABLES = ("mcp", "spawn", "run_command")
_NUMBERS = ("temperature", "top_p", "min_p")


class AgentFileError(ValueError):
    """agents.toml cannot be used; the message names the file, the role and what to fix."""


@dataclass(frozen=True)
class AgentSettings:
    """What one pane sends besides its messages. None means the app's default."""

    role: str | None = None  # the named definition these came from (shown in the pane title)
    system: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    # An agent role (docs/design/agents.md): the tools it may use (None: every tool), who approves
    # its writes and commands (None: ask), and the tool choice of its first turn (None: auto).
    tools: tuple[str, ...] | None = None
    approve: ApprovePolicy | None = None
    tool_choice: ToolChoiceMode | None = None

    def sampling(self, default: SamplingParams) -> SamplingParams:
        changes: dict[str, Any] = {k: v for k, v in (("temperature", self.temperature), ("max_tokens", self.max_tokens),
                                     ("top_p", self.top_p), ("min_p", self.min_p)) if v is not None}
        return replace(default, **changes) if changes else default

    @property
    def is_default(self) -> bool:
        return self == AgentSettings()


def agents_path() -> Path:
    return Path(platformdirs.user_config_dir("magnitude-tui", appauthor=False)) / "agents.toml"


def check_settings(*, temperature: float | None, max_tokens: int | None, top_p: float | None = None,
                   min_p: float | None = None) -> None:
    """ValueError (one line for the user) if a temperature, max_tokens, top_p or min_p cannot be used."""
    if temperature is not None and not (temperature >= 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature {temperature} is not allowed; use 0 (greedy) or more")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens {max_tokens} is too small; a reply needs at least 1 token")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p {top_p} is not allowed; use more than 0 and at most 1 (1: off)")
    if min_p is not None and not 0 <= min_p < 1:
        raise ValueError(f"min_p {min_p} is not allowed; use 0 (off) up to below 1")


def load_agents(path: Path | None = None) -> dict[str, AgentSettings]:
    """The roles defined in `path` (AgentFileError when it does not exist: it was asked for), else
    in agents.toml of the config directory (none when that does not exist)."""
    if path is None:
        path = agents_path()
        if not path.exists():
            return {}
    elif not path.is_file():
        raise AgentFileError(f"{path}: no such file (--agents names a TOML file of roles)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AgentFileError(f"{path}: {exc}") from None
    roles = {}
    for name, table in data.items():
        if name in RESERVED_TABLES:
            continue
        if not isinstance(table, dict):
            raise AgentFileError(f"{path}: {name!r} must be a table ([{name}] with system, temperature, max_tokens)")
        unknown = set(table) - _KEYS
        if unknown:
            raise AgentFileError(f"{path}: [{name}] has unknown key(s) {', '.join(sorted(unknown))}; "
                                 f"use {', '.join(sorted(_KEYS))}")
        system, max_tokens = table.get("system", ""), table.get("max_tokens")
        if not isinstance(system, str):
            raise AgentFileError(f"{path}: [{name}] system must be a string")
        for key in _NUMBERS:
            if key in table and (isinstance(table[key], bool) or not isinstance(table[key], (int, float))):
                raise AgentFileError(f"{path}: [{name}] {key} must be a number")
        if max_tokens is not None and not isinstance(max_tokens, int):
            raise AgentFileError(f"{path}: [{name}] max_tokens must be an integer")
        numbers = {key: float(table[key]) if key in table else None for key in _NUMBERS}
        try:
            check_settings(max_tokens=max_tokens, **numbers)
        except ValueError as exc:
            raise AgentFileError(f"{path}: [{name}] {exc}") from None
        roles[name] = AgentSettings(name, system, numbers["temperature"], max_tokens, numbers["top_p"],
                                    numbers["min_p"], *_agent_keys(path, name, table))
    return roles


def _agent_keys(path: Path, name: str, table: dict) -> tuple:
    """A role's tools, approve and tool_choice keys, checked."""
    tools = table.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise AgentFileError(f"{path}: [{name}] tools must be a list of tool names")
    approve = table.get("approve")
    try:
        approve = ApprovePolicy.parse(approve) if approve is not None else None
    except ValueError as exc:
        raise AgentFileError(f"{path}: [{name}] {exc}") from None
    choice = table.get("tool_choice")
    if choice is not None and choice not in ("auto", "required"):
        raise AgentFileError(f"{path}: [{name}] tool_choice {choice!r} is not allowed; use auto or required "
                             "(for the first turn)")
    return (tuple(tools) if tools is not None else None, approve,
            ToolChoiceMode(choice) if choice is not None else None)


class RoleBook:
    """The roles of one agents file, read again whenever the file changes (checked when a role is
    looked up, and on the workspace's timer). A file that turns bad keeps the last good roles, and
    `problem` says why until it is fixed."""

    def __init__(self, path: Path | None, roles: dict[str, AgentSettings] | None = None) -> None:
        """`path` None: a fixed set of roles (tests, a session without a file to follow)."""
        self.path = path
        self._roles = dict(roles) if roles is not None else {}
        self.problem: str | None = None
        # (mtime, size) of the file as last read; "unread" makes the first reload read it.
        self._stamp: tuple[int, int] | str | None = self._stat() if roles is not None else "unread"
        self.reload()

    def _stat(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def reload(self) -> bool:
        """Read the file again if it changed since the last read; True when the roles changed."""
        stamp = self._stat()
        if self.path is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            roles = load_agents(self.path) if stamp is not None else {}
        except AgentFileError as exc:
            self.problem = str(exc)
            return False
        self.problem = None
        changed, self._roles = roles != self._roles, roles
        return changed

    @property
    def roles(self) -> dict[str, AgentSettings]:
        """The current roles (the file is checked for changes first)."""
        self.reload()
        return self._roles

    def unknown(self, name: str) -> str:
        """What to tell a user who asked for role `name`, which is not defined."""
        return unknown_role(name, list(self.roles), self.path)


def unknown_role(name: str, known: list[str], path: Path | None = None) -> str:
    """The message for a role nobody defined: the known ones (and a near miss, if any)."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    where = f" in {path}" if path is not None else ""
    return f"unknown role {name!r}{hint}; known roles{where}: {', '.join(known) or 'none'}"
