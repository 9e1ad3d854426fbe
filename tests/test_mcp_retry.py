"""An MCP server given up on (it failed to start, or used up its restarts) is tried again, after a wait that grows with what its failures cost: by McpServers.retry, and in the TUI when the next agent starts, so a user who fixed the server need not edit the agents file or restart the app."""

from __future__ import annotations

import json
import os
import sys

from magnitude_tui.agent import mcp_tools
from magnitude_tui.agent.config import McpServerSpec
from magnitude_tui.agents import RoleBook
from tests.agent_app_support import ToolClient, agent_app, drive
from tests.app_support import type_message, wait_for
from tests.test_mcp_probe_faults import RAW, raw, started


def failing_until_fixed(tmp_path, **kw):
    """A raw_faults server that fails at start while tmp_path/broken exists (created here)."""
    flag = tmp_path / "broken"
    flag.write_text("")
    spec = raw("ok", **kw)
    return flag, McpServerSpec(spec.name, spec.command, spec.args, (("RAW_FAIL_WHILE", str(flag)),),
                               start_timeout_s=spec.start_timeout_s, timeout_s=spec.timeout_s)


async def test_a_server_that_failed_to_start_is_tried_again_after_a_wait_that_grows(tmp_path, monkeypatch):
    flag, spec = failing_until_fixed(tmp_path)
    servers = await started(spec)
    try:
        server = servers.servers[0]
        assert "not ready" in servers.problems["p"] and server.given_up
        # Not at once: a server that always fails would delay every agent's start.
        assert servers.due() == [] and server.retry_wait() >= mcp_tools.RETRY_MIN_S
        monkeypatch.setattr(mcp_tools, "RETRY_MIN_S", 0.5)
        monkeypatch.setattr(mcp_tools, "RETRY_FACTOR", 0.0)
        server._failed_at -= 0.5
        assert servers.due() == [server]
        await servers.retry(servers.due())  # still broken: the next wait is twice as long
        assert "not ready" in servers.problems["p"] and server.retry_wait() == 1.0
        assert servers.due() == []
        server._failed_at -= 1.0
        os.unlink(flag)  # the user fixed it
        await servers.retry(servers.due())
        assert servers.problems == {} and not server.given_up and server.retry_wait() == 0.5
        [ok] = [t for t in servers.tools()["p"] if t.name == "p__ok"]
        assert ok.unavailable is None and (await ok.run({})).text == "ok done"
    finally:
        await servers.close()


async def test_the_wait_before_a_new_try_grows_with_what_the_failed_start_cost():
    # A server that never answers `initialize` costs its start_timeout_s each try.
    servers = await started(raw("noinit", start_timeout_s=1.0))
    try:
        server = servers.servers[0]
        assert "did not start within 1 s" in servers.problems["p"]
        assert server.retry_wait() >= mcp_tools.RETRY_FACTOR * 1.0
    finally:
        await servers.close()


async def test_a_server_that_used_up_its_restarts_is_tried_again(monkeypatch):
    monkeypatch.setattr(mcp_tools, "MAX_RESTARTS", 1)
    monkeypatch.setattr(mcp_tools, "RETRY_MIN_S", 0.0)
    monkeypatch.setattr(mcp_tools, "RETRY_FACTOR", 0.0)
    servers = await started(raw("ok"))
    try:
        server = servers.servers[0]
        assert not (await server.call("crash", {})).ok
        assert not (await server.call("crash", {})).ok  # started again once, crashed again
        r = await server.call("ok", {})
        assert not r.ok and r.text.startswith("error: unavailable") and server.given_up
        assert servers.due() == [server]
        await servers.retry(servers.due())
        assert servers.problems == {} and (await server.call("ok", {})).text == "ok done"
    finally:
        await servers.close()


async def test_the_tui_tries_a_failed_server_again_when_the_next_agent_starts(tmp_path, monkeypatch):
    # The server fails at the first /agent; the user fixes it; the next /agent (the agents file
    # unchanged) tries it again, says so, and its agent calls its tool.
    flag = tmp_path / "broken"
    flag.write_text("")
    (tmp_path / "work").mkdir()
    path = tmp_path / "agents.toml"
    path.write_text(f'[user]\ntools = ["mcp.p"]\napprove = "auto"\n\n'
                    f'[mcp.p]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(RAW)}, "ok"]\n'
                    f'env = {{ RAW_FAIL_WHILE = {json.dumps(str(flag))} }}\n')

    def script(request):  # each task: one call, then what it answered
        last = request.messages[-1]
        return f"heard {last.content}" if last.role == "tool" else [("p__ok", {})]

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=RoleBook(path)) as (app, pilot):
        def notes() -> list[str]:
            return [n.message for n in app._notifications]

        pane = app.workspace.grid.panes[0]
        agents = app.workspace.agents
        await type_message(pilot, "/agent user first")
        await drive(pilot, client, lambda: not agents.running(pane) and "heard" in (pane.last_answer() or ""),
                    "the first answer")
        assert "p__ok" in pane.last_answer() and "ok done" not in pane.last_answer()  # no such tool then
        [failed] = [n for n in notes() if "not ready" in n]
        assert "its tools are unavailable (tried again at the first agent start after" in failed
        first = agents._mcp
        flag.unlink()
        monkeypatch.setattr(mcp_tools, "RETRY_MIN_S", 0.0)
        monkeypatch.setattr(mcp_tools, "RETRY_FACTOR", 0.0)
        await type_message(pilot, "/agent user second")
        await drive(pilot, client, lambda: not agents.running(pane) and "ok done" in (pane.last_answer() or ""),
                    "the second answer")
        await wait_for(pilot, lambda: any("started: its tools are available" in n for n in notes()),
                       what="the notice")
        assert "trying MCP server(s) again: p" in notes()
        assert agents._mcp is first and agents._mcp.problems == {}  # the same servers, not a new set
