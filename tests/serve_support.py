"""Runs `serve` for tests (the same helper the bench uses)."""

from magnitude_tui.serve.thread import RunningServer, free_port, serve_in_thread as running_server

__all__ = ["RunningServer", "free_port", "running_server"]
