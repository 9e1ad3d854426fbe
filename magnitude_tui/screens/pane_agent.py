"""Provides agents in panes: PaneRunner (the loop's turns through the workspace's engine link) and PaneAgents (run a pane as an agent: approval dialog, `tool` phase, tool blocks, subagent panes)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from magnitude_tui.agent.config import AgentFileConfig, load_agent_config
from magnitude_tui.agent.engine_link import TurnResult, collect_turn
from magnitude_tui.agent.events import (
    AgentEvent,
    AgentFinished,
    ApprovalDecided,
    ApprovalWaiting,
    SubagentSpawned,
    ToolFinished,
    ToolStarted,
    TurnStarted,
)
from magnitude_tui.agent.mcp_tools import McpServer, McpServers
from magnitude_tui.agent.policy import ApprovalRequest
from magnitude_tui.agent.team import AgentTeam, RoleToolsError
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentFileError, AgentSettings
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.records import MessageRecord, PaneRecord, take_sent_results
from magnitude_tui.screens.approval_dialog import DialogApproval
from magnitude_tui.subagents import next_name
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.tool_block import ToolActivity
from magnitude_tui.widgets.tool_turn_view import answered_by
from scheduler.types import Message, Request

if TYPE_CHECKING:
    from textual.worker import Worker

    from magnitude_tui.screens.workspace import WorkspaceScreen


class PaneRunner:
    """The loop's TurnRunner on the workspace's engine client: requests go out with
    `client.submit`, their updates come back through the screen's EngineLink (which also paints them in the
    request's pane, so an agent's turns stream and report phases like a person's)."""

    def __init__(self, ws: WorkspaceScreen) -> None:
        self.ws = ws
        self._sinks: dict[str, asyncio.Queue] = {}  # request id -> its updates, for the waiting turn

    def take(self, update: SeqUpdate) -> None:
        """EngineLink hands every routed update here first."""
        sink = self._sinks.get(update.request_id)
        if sink is not None:
            sink.put_nowait(update)

    async def turn(self, request: Request, on_text: Callable[[str], None]) -> TurnResult:
        ws = self.ws
        # A subagent forks its parent's KV only when the current worker holds it.
        request = replace(request, fork_from=ws.model.fork_source(request.fork_from))
        sink: asyncio.Queue = asyncio.Queue()
        self._sinks[request.request_id] = sink
        pane = ws.panes_by_session().get(request.session_id)
        if pane is not None:
            # A result the loop cut to fit is kept as cut: what is saved, and sent again after a
            # reopen, is what the model saw (whole, it would not fit then either).
            cut = take_sent_results(pane.record.messages, request.messages)
            ws.store.save_messages([r for r in cut if r.id is not None])  # the others are not saved yet
            pane.begin_request(request.request_id)
        ws.client.submit(request)
        try:
            result = await collect_turn(sink.get, on_text)
        except asyncio.CancelledError:
            ws.client.cancel(request.request_id)
            raise
        finally:
            self._sinks.pop(request.request_id, None)
        pane = ws.panes_by_session().get(request.session_id)
        if pane is not None and result.calls and result.final.error is None:
            pane.chat.add_tool_turn(result.calls)  # what the loop keeps in its history, the pane keeps too
        return result

    def close_session(self, session_id: str) -> None:
        self.ws.client.close_session(session_id)
        self.ws.model.forget(session_id)


class PaneAgents:
    """The workspace owns one: which panes run an agent, and what their agents report."""

    def __init__(self, ws: WorkspaceScreen, workdir: Path | None) -> None:
        self.ws = ws
        self.workdir = workdir or Path.cwd()
        self.runner = PaneRunner(ws)
        self.approval = DialogApproval(ws.app, on_stop=self._stop_asking)
        self._running: dict[str, Worker] = {}  # session id -> the worker running its agent
        self._agent_panes: dict[str, ChatPane] = {}  # agent name -> the pane it runs in
        self._allowed: dict[str, set[str]] = {}  # session id -> tools allowed for that pane
        # session -> (the last run's messages, the pane's records when it ended)
        self._history: dict[str, tuple[list[Message], list[MessageRecord]]] = {}
        self._children: dict[str, str] = {}  # subagent name -> its pane's name
        self._parent_of: dict[str, str] = {}  # subagent name -> its parent agent's name
        self._team_of: dict[str, AgentTeam] = {}  # agent name -> the team it runs in (stops its subagents)
        # The agents file's [mcp.*] servers, started when the first agent needs them and kept for
        # the session (restarted when the file names other servers), and its [spawn] limits.
        self._mcp: McpServers | None = None
        self._mcp_specs: tuple = ()
        self._mcp_lock = asyncio.Lock()

    def running(self, pane: ChatPane) -> bool:
        """Whether an agent runs in the pane: its own, or a spawn_agents subagent it shows."""
        return pane.session_id in self._running or self._subagent_in(pane) is not None

    def stop(self, pane: ChatPane) -> bool:
        """Stop the agent the pane runs (with its subagents); in a subagent's pane, that subagent
        alone (its parent reads that it was stopped and goes on)."""
        worker = self._running.get(pane.session_id)
        if worker is not None:
            worker.cancel()
            return True
        name = self._subagent_in(pane)
        return name is not None and self._team_of[name].stop_subagent(name)

    def _subagent_in(self, pane: ChatPane) -> str | None:
        """The running subagent shown in `pane`, if any."""
        for name, shown in self._agent_panes.items():
            team = self._team_of.get(name)
            if shown is pane and name in self._parent_of and team is not None and team.runs_subagent(name):
                return name
        return None

    def _stop_asking(self, request: ApprovalRequest) -> None:
        """The approval dialog's "stop the agent": the asking agent's pane agent stops (a subagent
        runs inside its parent's spawn_agents call, so the agent its root pane runs)."""
        pane = self._agent_panes.get(self._root(request.agent))
        if pane is not None:
            self.stop(pane)

    def _root(self, name: str) -> str:
        """The pane agent whose spawn_agents calls (at any depth) started agent `name`."""
        while name in self._parent_of:
            name = self._parent_of[name]
        return name

    async def start(self, pane: ChatPane, task: str, role: str | None = None) -> None:
        """Run `task` as an agent in `pane` (with `role` from agents.toml, else the pane's own)."""
        ws = self.ws
        if self.running(pane) or pane.busy:  # after what runs now, as a typed message would be
            pane.queue(f"/agent {role} {task}" if role else f"/agent {task}")
            ws.store.set_queued(pane.session_id, pane.queued)
            return
        if role is not None:
            if role not in ws.roles:
                ws.warn(ws.role_book.unknown(role))
                return
            settings = ws.roles[role]
            pane.apply_settings(settings)
            ws.store.set_pane_settings(pane.session_id, settings)
        settings = pane.record.settings
        try:
            file_config = load_agent_config(ws.role_book.path)
        except AgentFileError as e:
            ws.notify(f"{pane.record.name}: cannot start the agent: {e}", severity="error", markup=False)
            return
        servers = await self._servers(file_config)
        try:
            workspace = Workspace(self.workdir, pass_env=file_config.pass_env)
            team = AgentTeam(self.runner, workspace, roles=ws.roles, approval=self.approval,
                             observer=self._observe, sampling=ws.sampling, mcp_tools=servers.tools(),
                             limits=file_config.spawn)
            loop = team.agent(settings, name=pane.record.name, session_id=pane.session_id)
        except (OSError, RoleToolsError) as e:
            ws.notify(f"{pane.record.name}: cannot start the agent: {e}", severity="error", markup=False)
            return
        loop.gate.allowed_tools = self._allowed.setdefault(pane.session_id, set())
        history = self._history_for(pane, settings)
        self._agent_panes[loop.name] = pane
        self._team_of[loop.name] = team
        await pane.add_message(MessageRecord("user", task))
        self._running[pane.session_id] = ws.run_worker(self._run(pane, loop, task, history),
                                                       group=f"agent-{pane.session_id}", exit_on_error=False)

    async def _servers(self, config: AgentFileConfig) -> McpServers:
        """The agents file's MCP servers, running; a server that fails only makes its tools
        unavailable (said in a notice), and is tried again when a later agent starts, once its
        wait is over (`McpServer.retry_wait`): a user who fixed it need not edit the file."""
        async with self._mcp_lock:
            if self._mcp is None or config.mcp != self._mcp_specs:
                if self._mcp is not None:
                    await self._mcp.close()
                self._mcp, self._mcp_specs = McpServers(config.mcp), config.mcp
                if config.mcp:
                    self.ws.notify(f"starting MCP server(s): {', '.join(s.name for s in config.mcp)}", timeout=4)
                await self._mcp.start()
                self._say_failed(self._mcp.servers)
                return self._mcp
            due = self._mcp.due()
            if due:
                self.ws.notify(f"trying MCP server(s) again: {', '.join(s.spec.name for s in due)}", timeout=4)
                await self._mcp.retry(due)
                for server in due:
                    if server.problem is None:
                        self.ws.notify(f"MCP server {server.spec.name!r} started: its tools are available", timeout=6)
                self._say_failed(due)
            return self._mcp

    def _say_failed(self, servers: Iterable[McpServer]) -> None:
        for server in servers:
            if server.problem is not None:
                self.ws.notify(f"{server.problem}; its tools are unavailable (tried again at the first agent start "
                               f"after {server.retry_wait():.0f} s)", severity="warning", timeout=10, markup=False)

    async def close(self) -> None:
        """Stop the MCP servers (the app is closing)."""
        if self._mcp is not None:
            await self._mcp.close()
            self._mcp = None

    def _history_for(self, pane: ChatPane, settings: AgentSettings) -> list[Message]:
        """The last agent run's messages (as the model saw them: a tool result cut to fit stays
        cut) when the pane's records are still the ones it ended with; else the pane's
        conversation, tool turns included (after a reopen, an edit, a plain turn)."""
        kept = self._history.get(pane.session_id)
        records = pane.record.messages
        if kept is not None and len(kept[1]) == len(records) and all(a is b for a, b in zip(kept[1], records)):
            return kept[0]
        head = [Message("system", settings.system)] if settings.system else []
        return head + list(pane.conversation(committed_only=True, with_system=False))

    async def _run(self, pane: ChatPane, loop, task: str, history: list[Message]) -> None:
        ws = self.ws
        try:
            outcome = await loop.run(task, history)
            self._history[pane.session_id] = (outcome.messages, list(pane.record.messages))
            if outcome.error:
                ws.notify(f"{pane.record.name}: the agent stopped: {outcome.error}", severity="warning",
                          markup=False)
        except asyncio.CancelledError:
            ws.notify(f"{pane.record.name}: agent stopped")
            raise
        except Exception as e:  # a bug must not take the app down: say what failed
            ws.notify(f"{pane.record.name}: the agent failed: {type(e).__name__}: {e}", severity="error",
                      markup=False)
        finally:
            self._running.pop(pane.session_id, None)
            # Its subagents ended with it (stopped, their tools cancelled): none of their panes
            # waits on a tool any more, though a cancelled one reports nothing.
            for name, shown in self._agent_panes.items():
                if shown is pane or (name != loop.name and self._root(name) == loop.name):
                    self._set_activity(shown, None)
        if pane.queued and not pane.busy:
            await ws.model.turns.submitted(pane, pane.next_queued() or "")
            ws.model.keep_queue(pane)

    # ---- what the agents report -----------------------------------------------------------------

    def _observe(self, event: AgentEvent) -> None:
        if isinstance(event, SubagentSpawned):  # also for one that gets no pane
            self._parent_of[event.child] = event.agent
            if event.agent in self._team_of:
                self._team_of[event.child] = self._team_of[event.agent]
        pane = self._agent_panes.get(event.agent)
        if pane is None:
            return
        now = time.monotonic()
        if isinstance(event, ApprovalWaiting):
            self._set_activity(pane, ToolActivity(event.call.name, now, approval=True))
        elif isinstance(event, ToolStarted):
            self._set_activity(pane, ToolActivity(event.call.name, now))
        elif isinstance(event, ApprovalDecided) and not event.decision.allowed:
            self._set_activity(pane, None)
        elif isinstance(event, ToolFinished):
            self._set_activity(pane, None)
            panes = tuple(self._children.get(n, n) for n in answered_by(event.call.name, event.result))
            pane.add_tool_result(MessageRecord("tool", event.result, call=event.call, ok=event.ok,
                                               duration_s=event.duration_s, approval_wait_s=event.approval_wait_s),
                                 panes=panes)
        elif isinstance(event, (TurnStarted, AgentFinished)):
            self._set_activity(pane, None)
        elif isinstance(event, SubagentSpawned):
            self._open_child(pane, event)

    def _set_activity(self, pane: ChatPane, activity: ToolActivity | None) -> None:
        pane.set_activity(activity)
        self.ws.sequences_panel.set_activity(pane.session_id, activity)

    def _open_child(self, parent: ChatPane, event: SubagentSpawned) -> None:
        """A spawn_agents subagent gets a pane of its own (as /spawn's do), named like them."""
        ws = self.ws
        if ws.model.is_full:  # it still runs; its answer still reaches the parent's tool result
            ws.warn(f"No room for a pane for subagent {event.child}; it runs unseen")
            return
        name = next_name(f"{parent.record.name}.", set(ws.store.pane_names()))
        settings = ws.roles.get(event.role, parent.record.settings) if event.role else parent.record.settings
        record = PaneRecord(event.session_id, name, "subagent", parent.session_id, event.task,
                            ws.model.pane_count(), [MessageRecord("user", event.task)], settings)
        # Its answer reaches the parent as the spawn_agents result, not as a posted message.
        ws.model.subagents.reported.add(name)
        child = ChatPane(record, parent_name=parent.record.name)
        self._agent_panes[event.child] = child
        self._children[event.child] = name
        ws.open_pane(child)
