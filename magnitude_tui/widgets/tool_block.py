"""Provides an agent pane's tool activity (the `tool` phase: which tool, since when, waiting on approval or running) and the transcript's compact tool-call block."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from textual import events
from textual.widgets import Static

from magnitude_tui.agent.transcript import visible
from magnitude_tui.widgets.format import fmt_count

ARGS_SHOWN = 60  # characters of the arguments on a folded block's line
RESULT_SHOWN = 4000  # characters of the result an unfolded block shows (the rest is counted)


def fmt_elapsed(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60)} s"


@dataclass(frozen=True)
class ToolActivity:
    """What a pane in the `tool` phase waits on: the user's approval or the tool itself."""

    tool: str
    started: float  # time.monotonic()
    approval: bool = False

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def label(self, now: float | None = None) -> str:
        """For the status line: 'edit_file · approval · 3.2 s'."""
        what = "approval" if self.approval else "running"
        return f"{self.tool} · {what} · {fmt_elapsed(self.elapsed(now))}"

    def cell(self, now: float | None = None) -> str:
        """For the sequences panel's phase column (14 wide: the name may be cut)."""
        mark = "?" if self.approval else ""
        return f"tool{mark} {self.elapsed(now):.0f}s {self.tool}"


def one_line_args(arguments: str) -> str:
    try:
        text = json.dumps(json.loads(arguments or "{}"), ensure_ascii=False, separators=(", ", ": "))
    except ValueError:
        text = arguments
    return text if len(text) <= ARGS_SHOWN else text[:ARGS_SHOWN - 1] + "…"


class ToolBlock(Static):
    """One tool call in the transcript: name, arguments, duration (the tool's own), the wait for
    approval when someone was asked, result size (and, for
    spawn_agents, the panes its subagents ran in). A click (or enter when focused) unfolds
    the whole arguments and the result."""

    can_focus = True
    DEFAULT_CSS = """
    ToolBlock { height: auto; margin: 0 0 1 2; padding: 0 1; color: $text-muted; background: $boost; }
    ToolBlock.-failed { color: $warning; }
    ToolBlock:focus { background: $panel-lighten-1; }
    """
    BINDINGS = [("enter", "unfold", "Unfold")]

    def __init__(self, agent: str, name: str, arguments: str, duration_s: float | None, result: str, ok: bool,
                 *, panes: tuple[str, ...] = (), approval_wait_s: float | None = None) -> None:
        super().__init__("", markup=False, classes="" if ok else "-failed")
        self.agent = agent
        self.tool = name
        self.arguments = arguments
        self.duration_s = duration_s  # the call's own time, never the wait for approval
        self.approval_wait_s = approval_wait_s  # how long the person took to answer; None: not asked
        self.result = result
        self.ok = ok
        self.panes = panes  # subagents' panes (spawn_agents)
        self.unfolded = False

    def summary(self) -> str:
        mark = "✓" if self.ok else "✗"
        waited = "" if self.approval_wait_s is None else f"waited {fmt_elapsed(self.approval_wait_s)} for approval · "
        ran = "" if self.duration_s is None else f"{fmt_elapsed(self.duration_s)} · "  # None: run elsewhere
        line = f"{mark} {self.tool}({one_line_args(self.arguments)}) · {ran}{waited}{fmt_count(len(self.result))} chars"
        if self.panes:
            line += f" · answers from {', '.join(self.panes)}"
        return visible(line)

    def on_mount(self) -> None:
        self.update(self.summary())

    def action_unfold(self) -> None:
        self.unfolded = not self.unfolded
        if not self.unfolded:
            self.update(self.summary())
            return
        try:
            args = json.dumps(json.loads(self.arguments or "{}"), indent=2, ensure_ascii=False)
        except ValueError:
            args = self.arguments
        result = self.result[:RESULT_SHOWN]
        more = len(self.result) - len(result)
        tail = f"\n… {more:,} more characters" if more > 0 else ""
        # A command's or a file's bytes as a terminal would show them: an escape sequence in the
        # output (a `clear`, colors) would otherwise clear or redraw the screen over the app.
        self.update(f"{self.summary()}\n{visible(args)}\n──\n{visible(result)}{tail}")

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.action_unfold()
