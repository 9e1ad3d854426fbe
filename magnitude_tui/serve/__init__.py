"""Provides the OpenAI-compatible endpoint: `magnitude-tui serve`."""
