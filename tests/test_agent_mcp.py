"""MCP servers for agents: a stdio test server's tools join the loop; a server that fails to start only marks its tools unavailable, a hung call fails alone, a dead server is started again."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from magnitude_tui.agent.config import McpServerSpec
from magnitude_tui.agent.mcp_tools import McpServers
from magnitude_tui.agent.policy import ALLOW_ONCE, FixedApproval, ToolKind
from magnitude_tui.agent.team import AgentTeam
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings
from tests.test_agent_support import call, last_user, scripted_engine

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


def spec(*extra: str, start_timeout_s: float = 60.0, timeout_s: float = 20.0, name: str = "test") -> McpServerSpec:
    return McpServerSpec(name, sys.executable, (SERVER, *extra), start_timeout_s=start_timeout_s, timeout_s=timeout_s)


async def test_an_mcp_tool_is_called_by_the_agent_loop(tmp_path):
    servers = McpServers([spec()])
    await servers.start()
    try:
        assert servers.problems == {}
        tools = {t.name: t for t in servers.tools()["test"]}
        assert set(tools) == {"test__shout", "test__add", "test__hang", "test__die"}
        assert tools["test__shout"].kind is ToolKind.READ and tools["test__add"].kind is ToolKind.RUN

        def script(prompt):
            user = last_user(prompt)
            if "<tool_response>\nHELLO!" in user:
                return call("test__add", a=2, b=3)
            if user.startswith("<tool_response>"):
                return f"Sum: {user.splitlines()[1]}"
            return call("test__shout", text="hello")

        approval = FixedApproval(ALLOW_ONCE)
        role = AgentSettings("mcp-user", tools=("mcp.test",))
        async with scripted_engine(script) as (runner, _, _):
            team = AgentTeam(runner, Workspace(tmp_path), approval=approval, mcp_tools=servers.tools())
            loop = team.agent(role, name="main", session_id="main")
            out = await loop.run("shout then add")
        assert out.ok and out.answer == "Sum: 5"
        assert [m.content for m in out.messages if m.role == "tool"] == ["HELLO!", "5"]
        # shout says it only reads; add does not say so and is asked about.
        assert [a.tool for a in approval.asked] == ["test__add"]
    finally:
        await servers.close()


async def test_a_server_that_fails_to_start_reports_why():
    servers = McpServers([spec("--fail-start")])
    await servers.start()
    assert "cannot open the test database" in servers.problems["test"]
    assert servers.tools() == {"test": []}
    await servers.close()


async def test_a_server_that_hangs_at_start_is_given_up_on():
    servers = McpServers([spec("--hang-start", start_timeout_s=1.0)])
    t0 = time.monotonic()
    await servers.start()
    assert "did not start within 1 s" in servers.problems["test"]
    assert time.monotonic() - t0 < 10
    await servers.close()


async def test_a_hanging_call_fails_alone_and_a_dead_server_is_started_again():
    servers = McpServers([spec(timeout_s=2.0, name="slow"), spec(name="dies")])
    await servers.start()
    try:
        slow = {t.name: t for t in servers.tools()["slow"]}
        r = await slow["slow__hang"].run({"seconds": 30})
        assert not r.ok and "did not answer within 2 s" in r.text
        # The server still answers (a ping): only that call failed.
        r = await slow["slow__shout"].run({"text": "x"})
        assert r.ok and r.text == "X!"

        dies = {t.name: t for t in servers.tools()["dies"]}
        r = await asyncio.wait_for(dies["dies__die"].run({}), 30)
        assert not r.ok and r.text.startswith("error: MCP server 'dies': die failed")
        assert "started again at the next call" in r.text
        # The next call starts it again.
        r = await asyncio.wait_for(dies["dies__add"].run({"a": 1, "b": 2}), 60)
        assert r.ok and r.text == "3"
        assert servers.problems == {}
    finally:
        await asyncio.wait_for(servers.close(), 30)


async def test_a_missing_program_is_a_problem_not_an_exception():
    servers = McpServers([McpServerSpec("ghost", "/nonexistent/mcp-server")])
    await servers.start()
    assert "ghost" in servers.problems and servers.tools() == {"ghost": []}
    await servers.close()
