"""Provides the workspace's limits: how many panes the grid holds and so how many subagents one
spawn may open."""

MAX_PANES = 16
MAX_SUBAGENTS = MAX_PANES - 1  # a spawn keeps its parent's pane
