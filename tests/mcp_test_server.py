"""Provides a tiny stdio MCP server for the agent tests (`python tests/mcp_test_server.py [--fail-start|--hang-start]`)."""

from __future__ import annotations

import os
import sys
import time

try:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp 2.x renamed FastMCP
except ImportError:  # pragma: no cover - mcp 1.x
    from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

if "--fail-start" in sys.argv:
    print("cannot open the test database", file=sys.stderr)
    sys.exit(3)
if "--hang-start" in sys.argv:
    time.sleep(3600)

server = FastMCP("test")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def shout(text: str) -> str:
    """Return the text in capitals."""
    return text.upper() + "!"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def hang(seconds: float) -> str:
    """Sleep, then answer (longer than the client waits)."""
    time.sleep(seconds)
    return "late"


@server.tool()
def die() -> str:
    """End the server process at once."""
    os._exit(1)


if __name__ == "__main__":
    server.run()
