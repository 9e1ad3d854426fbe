"""An MCP server started again (tests/mcp_servers/raw_faults.py): a call lost with the old server does not fail the new one, an answer of any kind resets the restart count, and the SDK hook still records the server's pid."""

from __future__ import annotations

import asyncio

import pytest

from magnitude_tui.agent import mcp_tools
from tests.test_mcp_probe_faults import alive, raw, started


@pytest.mark.parametrize("late", ["timeout", "error"])
async def test_a_call_lost_with_the_old_server_leaves_the_new_one_alone(monkeypatch, late):
    # The SDK wakes a call waiting on a session that closes; one woken only after the server was
    # started again (it timed out, or its error came late) used to mark the new server failed,
    # and a timeout stopped it.
    real = mcp_tools._call_tool
    first: list = []
    restarted = asyncio.Event()

    async def held(session, name, args):
        first.append(first[0] if first else session)
        if name != "hang" or session is not first[0]:
            return await real(session, name, args)
        try:
            await real(session, name, args)
        except BaseException:
            if late == "timeout":
                await asyncio.Event().wait()  # never woken: it times out
            await restarted.wait()
            raise

    monkeypatch.setattr(mcp_tools, "_call_tool", held)
    servers = await started(raw("ok", timeout_s=1.0))
    try:
        server = servers.servers[0]
        old = int((await server.call("pid", {})).text)
        hung = asyncio.create_task(server.call("hang", {}))
        await asyncio.sleep(0.2)
        assert not (await server.call("crash", {})).ok
        new = int((await server.call("pid", {})).text)  # started again
        assert new != old and not alive(old)
        restarted.set()
        r = await hung
        # The new server was neither marked failed nor stopped: the same process answers.
        assert servers.problems == {}
        assert int((await server.call("pid", {})).text) == new and alive(new)
        assert not r.ok and "started again since" in r.text, r.text
    finally:
        await servers.close()


async def test_an_error_or_malformed_answer_resets_the_restart_count():
    servers = await started(raw("ok"))
    try:
        server = servers.servers[0]
        # Each crash is followed by an answer (an error, or one off the MCP schema): the server
        # answers, so it is not one that keeps dying; it is started again every time.
        for i in range(2 * mcp_tools.MAX_RESTARTS):
            assert not (await server.call("crash", {})).ok
            r = await server.call("rpcerror" if i % 2 else "badshape", {})
            assert not r.ok and "unavailable" not in r.text and "started again" not in r.text, r.text
        r = await server.call("ok", {})
        assert r.ok and r.text == "ok done"
    finally:
        await servers.close()


async def test_the_servers_pid_is_recorded_for_its_group_to_be_ended():
    # hook_spawn wraps a private function of the SDK (mcp.client.stdio._create_platform_compatible_process):
    # renamed, the pid is not recorded and what a server leaves behind is not ended, silently.
    servers = await started(raw("ok"), raw("ok", name="q"))
    try:
        for server in servers.servers:
            assert server._pids == [int((await server.call("pid", {})).text)]
    finally:
        await servers.close()


async def test_a_timed_out_call_the_server_still_pings_for_resets_the_restart_count(monkeypatch):
    # A server that answers a ping is alive, as one that answers a call is: a later crash gets its
    # full restarts. (A timeout with the ping answered used to leave the count as it was, so a
    # server with one slow tool between its crashes was given up after MAX_RESTARTS.)
    monkeypatch.setattr(mcp_tools, "MAX_RESTARTS", 1)
    servers = await started(raw("ok", timeout_s=0.5))
    try:
        server = servers.servers[0]
        for _ in range(2):
            assert not (await server.call("crash", {})).ok
            r = await server.call("hang", {})  # started again (the one restart), then times out
            assert not r.ok and "the server still answers" in r.text, r.text
        r = await server.call("ok", {})
        assert r.ok and r.text == "ok done", r.text
    finally:
        await servers.close()
