"""Provides agents that act: built-in tools, approval, MCP servers, the tool loop and headless runs (no Textual)."""
