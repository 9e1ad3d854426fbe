"""A bare stdio JSON-RPC MCP server that misbehaves on purpose (`python raw_faults.py MODE [PIDFILE]`).

Modes: ok (every tool behaves as its name says), garbage (a banner on stdout, never JSON-RPC),
noinit (never answers `initialize`), odd (tools with odd names and schemas, listed in two pages;
odd1: in one page),
child (starts a child process, its pid written to PIDFILE, that outlives the server's end),
wedge (the `hang` tool stops the server reading anything). With RAW_PIDFILE set it writes its pid there;
with RAW_FAIL_WHILE set to a path, it fails at start (a message on stderr, exit 3) while that path exists.
Tools: ok, huge (8 MiB of text, or `bytes`), resource (an embedded text resource and a link), nonutf8 (a byte
that is not UTF-8 in its text), image, emptyerr (isError with no content), rpcerror (a JSON-RPC error answer), badshape (content that is not a list), textonly / offschema / brokenout (an outputSchema: text only,
structuredContent that does not match it, an outputSchema with a $ref to nowhere), crash (the process exits), hang (never answered), pid (the
server's pid), noisy (writes `bytes` of noise on stderr, then `last` and a newline, then answers, or
exits when `then` is "crash").
"""

import json
import os
import subprocess
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
out = sys.stdout.buffer


def send(obj) -> None:
    out.write((json.dumps(obj) + "\n").encode())
    out.flush()


def tool(name, schema=None, **extra):
    return {"name": name, "description": name, "inputSchema": schema or {"type": "object"}, **extra}


OUT = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
BASIC = [tool(n) for n in ("ok", "huge", "resource", "nonutf8", "crash", "hang", "pid", "image", "emptyerr", "badshape", "rpcerror",
                            "noisy")] + [
    tool("textonly", outputSchema=OUT), tool("offschema", outputSchema=OUT),
    tool("brokenout", outputSchema={"type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}})]
ODD = [
    tool("unanchored", {"type": "object", "properties": {"code": {"type": "string", "pattern": "[a-z]+"}},
                        "required": ["code"]}),
    tool("tree", {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}},
                  "$defs": {"N": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}}}}}),
    tool("nowhere", {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    tool("huge_schema", {"type": "object", "properties": {f"f{i}": {"type": "string", "description": "d" * 100}
                                                         for i in range(400)}}),
    tool("we.ird name"), tool("we_ird_name"),
]

if os.environ.get("RAW_PIDFILE"):  # its own pid, for a test that looks for it afterwards
    with open(os.environ["RAW_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
if os.environ.get("RAW_FAIL_WHILE") and os.path.exists(os.environ["RAW_FAIL_WHILE"]):
    print(f"not ready: {os.environ['RAW_FAIL_WHILE']} exists", file=sys.stderr, flush=True)
    sys.exit(3)
if MODE == "garbage":
    out.write(b"Welcome to the server! Listening on stdio...\n")
    out.flush()
    time.sleep(3600)
if MODE == "child":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(sys.argv[2], "w") as f:
        f.write(str(child.pid))

for line in sys.stdin.buffer:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, rid = msg.get("method"), msg["id"]
    if method == "initialize":
        if MODE == "noinit":
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"}}})
    elif method == "tools/list":
        if MODE == "odd":  # two pages
            cursor = (msg.get("params") or {}).get("cursor")
            page = {"tools": BASIC, "nextCursor": "page2"} if cursor is None else {"tools": ODD}
            send({"jsonrpc": "2.0", "id": rid, "result": page})
        elif MODE == "odd1":
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": BASIC + ODD}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": BASIC}})
    elif method == "tools/call":
        name = msg["params"]["name"]
        if name == "hang":
            if MODE == "wedge":
                time.sleep(3600)
            continue
        if name == "crash":
            os._exit(1)
        if name == "noisy":
            args = msg["params"].get("arguments") or {}
            left = int(args.get("bytes", 1 << 20))
            while left > 0:
                n = min(left, 65536)
                sys.stderr.buffer.write(b"n" * (n - 1) + b"\n")
                left -= n
            sys.stderr.buffer.write(str(args.get("last", "")).encode() + b"\n")
            sys.stderr.buffer.flush()
            if args.get("then") == "crash":
                os._exit(1)
        if name == "nonutf8":
            out.write(b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [{"type": "text", "text": "caf\xe9 ok"}]}}\n' % rid)
            out.flush()
            continue
        if name == "huge":  # `bytes` of text (8 MiB by default)
            size = int((msg["params"].get("arguments") or {}).get("bytes", 8 * 1024 * 1024))
            content = [{"type": "text", "text": "A" * size}]
        elif name == "resource":
            content = [{"type": "resource", "resource": {"uri": "file:///notes.txt", "text": "the notes", "mimeType": "text/plain"}},
                       {"type": "resource_link", "uri": "file:///other.txt", "name": "other"}]
        elif name == "image":
            content = [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]
        elif name == "badshape":  # a result, but not a CallToolResult
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list"}})
            continue
        elif name == "textonly":  # an outputSchema, but only text
            content = [{"type": "text", "text": "plain text"}]
        elif name in ("offschema", "brokenout"):  # structuredContent its outputSchema refuses, or cannot check
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "a is 1"}],
                                                          "structuredContent": {"a": 1}}})
            continue
        elif name == "rpcerror":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad arguments"}})
            continue
        elif name == "emptyerr":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [], "isError": True}})
            continue
        elif name == "pid":
            content = [{"type": "text", "text": str(os.getpid())}]
        else:
            content = [{"type": "text", "text": name + " done"}]
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": content}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no " + str(method)}})
