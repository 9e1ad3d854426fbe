"""An MCP server's error answer to one call fails that call alone; a call's failure names only what the server said on stderr during it."""

from __future__ import annotations

import sys
import textwrap

from magnitude_tui.agent.config import McpServerSpec
from magnitude_tui.agent.mcp_tools import McpServers

# A bare stdio JSON-RPC server (as other SDKs behave): `rpcerr` is answered with a JSON-RPC error
# (a TypeScript server's thrown McpError), `noisy` writes on stderr, `hang` is never answered.
RAW_SERVER = textwrap.dedent('''
    import json, sys
    TOOLS = [{"name": n, "description": n, "inputSchema": {"type": "object", "properties": {}}}
             for n in ("noisy", "rpcerr", "hang", "ok")]
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method, rid = msg.get("method"), msg["id"]
        if method == "initialize":
            result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "raw", "version": "0"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            name = msg["params"]["name"]
            if name == "hang":
                continue
            if name == "rpcerr":
                error = {"code": -32602, "message": "bad params for rpcerr"}
                print(json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}), flush=True)
                continue
            if name == "noisy":
                print("OLD-NOISE from an earlier call", file=sys.stderr, flush=True)
            result = {"content": [{"type": "text", "text": name + " done"}], "isError": False}
        else:
            error = {"code": -32601, "message": "no " + str(method)}
            print(json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}), flush=True)
''')


async def test_an_error_answer_fails_its_call_alone_and_a_hang_names_no_earlier_stderr(tmp_path):
    script = tmp_path / "raw_server.py"
    script.write_text(RAW_SERVER)
    servers = McpServers([McpServerSpec("raw", sys.executable, (str(script),), timeout_s=1.0)])
    await servers.start()
    try:
        assert servers.problems == {}
        server = servers.servers[0]
        assert (await server.call("noisy", {})).ok
        failed = await server.call("rpcerr", {})
        assert not failed.ok and "bad params for rpcerr" in failed.text and "unavailable" not in failed.text
        assert servers.problems == {}
        ok = await server.call("ok", {})  # the server answered an error; it is still there
        assert ok.ok and ok.text == "ok done"
        hung = await server.call("hang", {})
        assert not hung.ok and "hang did not answer within 1 s" in hung.text
        assert "OLD-NOISE" not in hung.text  # said by an earlier call, not by this one
    finally:
        await servers.close()
