"""Provides the agent tables of agents.toml that are not roles: `[mcp.NAME]` servers, `[spawn]` limits and `[run_command]`'s environment."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from magnitude_tui.agents import AgentFileError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@dataclass(frozen=True)
class McpServerSpec:
    """A stdio MCP server: the program the app starts and talks to over its stdin/stdout."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # added to the app's environment
    # A server that takes longer to start, or to answer one call, is marked unavailable.
    start_timeout_s: float = 30.0
    timeout_s: float = 60.0


@dataclass(frozen=True)
class SpawnLimits:
    """How far spawn_agents may go: nesting depth, agents per call, agents in one run."""

    max_depth: int = 2  # a subagent (depth 1) may spawn once more; depth 2 may not
    max_per_call: int = 8
    max_total: int = 32


@dataclass(frozen=True)
class AgentFileConfig:
    mcp: tuple[McpServerSpec, ...] = ()
    spawn: SpawnLimits = field(default_factory=SpawnLimits)
    # `[run_command] pass_env`: variables passed to commands although their names look secret.
    pass_env: tuple[str, ...] = ()


def load_agent_config(path: Path | None) -> AgentFileConfig:
    """The `[mcp.*]` and `[spawn]` tables of an agents file (defaults when there is none)."""
    if path is None or not path.is_file():
        return AgentFileConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AgentFileError(f"{path}: {exc}") from None
    return AgentFileConfig(tuple(_mcp(path, data.get("mcp", {}))), _spawn(path, data.get("spawn", {})),
                           _pass_env(path, data.get("run_command", {})))


def _pass_env(path: Path, table) -> tuple[str, ...]:
    if not isinstance(table, dict) or set(table) - {"pass_env"}:
        raise AgentFileError(f"{path}: [run_command] takes one key, pass_env = [\"NAME\", ...]")
    names = table.get("pass_env", [])
    if not (isinstance(names, list) and all(isinstance(n, str) and n for n in names)):
        raise AgentFileError(f"{path}: [run_command] pass_env must be a list of variable names (or patterns: AWS_*)")
    return tuple(names)


def _mcp(path: Path, table) -> list[McpServerSpec]:
    if not isinstance(table, dict):
        raise AgentFileError(f"{path}: mcp must hold tables ([mcp.NAME] with command, args, env)")
    out = []
    for name, t in table.items():
        where = f"{path}: [mcp.{name}]"
        if not isinstance(t, dict) or not isinstance(t.get("command"), str) or not t["command"]:
            raise AgentFileError(f"{where} needs command = \"program\"")
        unknown = set(t) - {"command", "args", "env", "timeout_s", "start_timeout_s"}
        if unknown:
            raise AgentFileError(f"{where} has unknown key(s) {', '.join(sorted(unknown))}; "
                                 "use command, args, env, timeout_s, start_timeout_s")
        args, env = t.get("args", []), t.get("env", {})
        if not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            raise AgentFileError(f"{where} args must be a list of strings")
        if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
            raise AgentFileError(f"{where} env must be a table of strings")
        timeouts = {k: t.get(k, McpServerSpec.__dataclass_fields__[k].default) for k in ("start_timeout_s", "timeout_s")}
        for key, value in timeouts.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise AgentFileError(f"{where} {key} must be a positive number of seconds")
        out.append(McpServerSpec(name, t["command"], tuple(args), tuple(sorted(env.items())),
                                 **{k: float(v) for k, v in timeouts.items()}))
    return out


def _spawn(path: Path, table) -> SpawnLimits:
    if not isinstance(table, dict):
        raise AgentFileError(f"{path}: spawn must be a table (max_depth, max_per_call, max_total)")
    unknown = set(table) - {"max_depth", "max_per_call", "max_total"}
    if unknown:
        raise AgentFileError(f"{path}: [spawn] has unknown key(s) {', '.join(sorted(unknown))}; "
                             "use max_depth, max_per_call, max_total")
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise AgentFileError(f"{path}: [spawn] {key} must be a whole number, 0 or more")
    return SpawnLimits(**table)
