"""Provides AgentTeam: builds agents from roles (tools, approval, sampling) and runs the subagents spawn_agents asks for."""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Mapping

from magnitude_tui.agent.command import CommandTool
from magnitude_tui.agent.config import SpawnLimits
from magnitude_tui.agent.engine_link import TurnRunner
from magnitude_tui.agent.events import AgentFinished, AgentObserver, EndReason, SubagentSpawned, ignore
from magnitude_tui.agent.fs_tools import FileTools
from magnitude_tui.agent.loop import AgentConfig, AgentLoop, AgentOutcome
from magnitude_tui.agent.policy import Approval, ApprovalGate, ApprovePolicy, ToolKind
from magnitude_tui.agent.toolbox import AgentTool, ToolResult, function_tool
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings, unknown_role
from scheduler.types import Message, Priority, SamplingParams, ToolChoiceMode

SPAWN = "spawn_agents"
# A role's `tools` entry naming every tool of one MCP server.
MCP_PREFIX = "mcp."


class RoleToolsError(ValueError):
    """A role names a tool that does not exist; the message lists the known ones."""


@dataclass
class AgentTeam:
    """Everything agents of one run (or one workspace) share."""

    runner: TurnRunner
    workspace: Workspace
    roles: Mapping[str, AgentSettings] = field(default_factory=dict)
    approval: Approval | None = None
    observer: AgentObserver = ignore
    mcp_tools: Mapping[str, list[AgentTool]] = field(default_factory=dict)  # server name -> its tools
    limits: SpawnLimits = field(default_factory=SpawnLimits)
    sampling: SamplingParams = SamplingParams(max_tokens=1024)
    max_turns: int = 20

    def __post_init__(self) -> None:
        self._builtins = {t.name: t for t in [*FileTools(self.workspace).tools(), CommandTool(self.workspace).tool()]}
        self._count = itertools.count(1)
        self._settings: dict[str, AgentSettings] = {}  # agent name -> its role (subagents inherit it)
        self.spawned = 0
        self._children: dict[str, asyncio.Future] = {}  # running subagent's name -> its run
        self._stopping: set[str] = set()  # subagents stop_subagent cancelled

    # ---- building agents ----------------------------------------------------------------------

    def known_tools(self) -> list[str]:
        return [*self._builtins, SPAWN, *(MCP_PREFIX + s for s in self.mcp_tools),
                *(t.name for ts in self.mcp_tools.values() for t in ts)]

    def agent(self, settings: AgentSettings, *, name: str, session_id: str, policy: ApprovePolicy | None = None,
              parent: AgentLoop | None = None) -> AgentLoop:
        """An agent of role `settings`; `policy` None: the role's own (ask when it names none). A
        subagent's policy is never looser than its parent's."""
        policy = policy or settings.approve or ApprovePolicy.ASK
        if parent is not None:
            policy = parent.gate.policy.strictest(policy)
        holder: list[AgentLoop] = []
        tools = self._tools_for(settings, policy, holder)
        ask_anyway: frozenset[str] = frozenset()
        if parent is not None and policy is ApprovePolicy.AUTO:
            # A role's `auto` covers the tools its parent could run unasked, no more: a read-only
            # parent's subagent in an `auto` role with run_command asks before each command.
            ask_anyway = frozenset(t.name for t in tools if t.kind is not ToolKind.READ
                                   and not (t.name in parent.tools and parent.gate.runs_unasked(t.name)))
        config = AgentConfig(
            name=name, session_id=session_id, sampling=settings.sampling(self.sampling), max_turns=self.max_turns,
            first_tool_choice=settings.tool_choice or ToolChoiceMode.AUTO,
            parent=parent.name if parent is not None else None,
            fork_from=parent.config.session_id if parent is not None else None,
            depth=parent.config.depth + 1 if parent is not None else 0,
            priority=Priority.AGENT if parent is not None else Priority.INTERACTIVE)
        loop = AgentLoop(self.runner, config, tools, ApprovalGate(policy, self.approval, ask_anyway), self.observer)
        holder.append(loop)
        self._settings[name] = settings
        return loop

    def history(self, settings: AgentSettings) -> list[Message]:
        """What an agent of this role starts with before its task."""
        return [Message("system", settings.system)] if settings.system else []

    def _tools_for(self, settings: AgentSettings, policy: ApprovePolicy, holder: list) -> list[AgentTool]:
        by_name = {**self._builtins, SPAWN: self._spawn_tool(holder),
                   **{t.name: t for ts in self.mcp_tools.values() for t in ts}}
        if settings.tools is None:
            chosen = list(by_name.values())
        else:
            chosen = []
            for entry in settings.tools:
                if entry.startswith(MCP_PREFIX) and entry[len(MCP_PREFIX):] in self.mcp_tools:
                    chosen.extend(self.mcp_tools[entry[len(MCP_PREFIX):]])
                elif entry in by_name:
                    chosen.append(by_name[entry])
                else:
                    raise RoleToolsError(f"role {settings.role or '(default)'!r} names tool {entry!r}, which does "
                                         f"not exist; known tools: {', '.join(self.known_tools())}")
        if policy is ApprovePolicy.READ_ONLY:  # a read-only agent is not even shown what it may not use
            chosen = [t for t in chosen if t.kind is ToolKind.READ]
        return list({t.name: t for t in chosen}.values())

    # ---- spawn_agents -------------------------------------------------------------------------

    def _spawn_tool(self, holder: list) -> AgentTool:
        schema = function_tool(
            SPAWN, "Start subagents that work at the same time, each on its own task (optionally in a named "
            "role); their answers come back together as this call's result.",
            {"agents": {"type": "array", "minItems": 1, "items": {
                "type": "object", "properties": {"task": {"type": "string"}, "role": {"type": "string"}},
                "required": ["task"], "additionalProperties": False}}}, ["agents"])

        async def run(args: dict) -> ToolResult:
            return await self.spawn(holder[0], args["agents"])

        # Spawning changes nothing by itself: each subagent asks for its own writes and commands.
        return AgentTool(schema, ToolKind.READ, run)

    def stop_subagent(self, name: str) -> bool:
        """Stop one running subagent (its turn, tool or approval question, and its own subagents),
        not its siblings or its parent: its entry in the spawn_agents result says it was stopped.
        False when no subagent of that name runs."""
        task = self._children.get(name)
        if task is None or task.done():
            return False
        self._stopping.add(name)
        task.cancel()
        return True

    def runs_subagent(self, name: str) -> bool:
        return name in self._children and not self._children[name].done()

    async def _run_child(self, child: AgentLoop, text: str, history: list[Message]) -> AgentOutcome:
        # The child runs in a task of its own, so that stop_subagent can cancel it alone: its
        # cancellation ends this wait with an outcome, while the parent's still propagates.
        run = asyncio.ensure_future(child.run(text, history))
        self._children[child.name] = run
        try:
            return await run
        except asyncio.CancelledError:
            if not (run.cancelled() and child.name in self._stopping):
                raise
            error = "stopped by the user"
            self.observer(AgentFinished(child.name, EndReason.CANCELLED, "", error))
            return AgentOutcome(EndReason.CANCELLED, "", child.messages, [], error)
        finally:
            self._stopping.discard(child.name)
            self._children.pop(child.name, None)

    async def spawn(self, parent: AgentLoop, asks: list[dict]) -> ToolResult:
        limits = self.limits
        if parent.config.depth >= limits.max_depth:
            return ToolResult.refused(f"subagents may not be nested deeper than {limits.max_depth} "
                                      "(agents.toml [spawn] max_depth); do the task yourself")
        if len(asks) > limits.max_per_call:
            return ToolResult.refused(f"at most {limits.max_per_call} subagents per call "
                                      f"([spawn] max_per_call); {len(asks)} were asked for")
        if self.spawned + len(asks) > limits.max_total:
            return ToolResult.refused(f"this run may start {limits.max_total} subagents in all ([spawn] max_total); "
                                      f"{self.spawned} have run, {len(asks)} more were asked for")
        parent_role = self._settings.get(parent.name, AgentSettings())
        children: list[tuple[AgentLoop, str, list[Message], dict]] = []
        try:
            for i, ask in enumerate(asks, 1):
                role = ask.get("role")
                if role is not None and role not in self.roles:
                    return ToolResult.refused(unknown_role(role, list(self.roles)))
                settings = self.roles[role] if role is not None else parent_role
                idx = next(self._count)
                child = self.agent(settings, name=f"{parent.name}/{idx}", session_id=f"{parent.config.session_id}-{idx}",
                                   parent=parent)
                # The parent's own role: the child starts from its whole conversation (before this
                # call), so the fork shares all of the parent's KV; another role starts afresh.
                same = role is None or settings == parent_role
                history = parent.messages[:-1] if same else self.history(settings)
                text = (f"You are subagent {i} of {len(asks)}, started by {parent.name}. Your task: {ask['task']}\n"
                        f"Answer with the result only; your answer goes back to {parent.name}.")
                children.append((child, text, history, ask))
        except RoleToolsError as e:
            return ToolResult.refused(str(e))
        self.spawned += len(children)
        for child, _, _, ask in children:
            self.observer(SubagentSpawned(parent.name, child.name, child.config.session_id, ask["task"], ask.get("role")))
        try:
            outcomes = await asyncio.gather(*(self._run_child(child, text, history) for child, text, history, _ in children))
        finally:
            for child, *_ in children:
                self.runner.close_session(child.config.session_id)
        return ToolResult(json.dumps([_answer(child, ask, out) for (child, _, _, ask), out in zip(children, outcomes)],
                                     ensure_ascii=False, indent=1),
                          ok=all(out.ok for out in outcomes))


def _answer(child: AgentLoop, ask: dict, out: AgentOutcome) -> dict:
    entry = {"agent": child.name, "task": ask["task"], "ended": out.reason.value, "answer": out.answer}
    if ask.get("role"):
        entry["role"] = ask["role"]
    if out.error:
        entry["error"] = out.error
    return entry
