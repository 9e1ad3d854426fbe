"""Provides the spawn dialog: how many subagents, and their task."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label

from magnitude_tui.subagents import SpawnSpec
from magnitude_tui.workspace.limits import MAX_SUBAGENTS


class SpawnDialog(ModalScreen[SpawnSpec | None]):
    """Asks for N and a task; each subagent forks from the parent's conversation."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    SpawnDialog { align: center middle; }
    SpawnDialog > Vertical { width: 70; height: auto; max-width: 100%; max-height: 100%; overflow-y: auto; padding: 1 2; border: thick $accent;
                             background: $surface; }
    SpawnDialog Label { margin: 1 0 0 0; color: $text-muted; }
    SpawnDialog #spawn-title { margin: 0; text-style: bold; color: $text; }
    SpawnDialog Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    SpawnDialog Button { margin-left: 1; }
    """

    def __init__(self, parent_name: str, *, count: int = 3, task: str = "",
                 roles: tuple[str, ...] = ()) -> None:
        super().__init__()
        self._roles = roles
        self._parent_name = parent_name
        self._default_count = count
        self._default_task = task

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Spawn subagents from {self._parent_name}", id="spawn-title", markup=False)
            yield Label(f"How many (1-{MAX_SUBAGENTS})")
            yield Input(str(self._default_count), type="integer", id="spawn-count")
            yield Label("Task (each subagent sees the whole conversation first)")
            yield Input(self._default_task, placeholder="e.g. list three risks of this plan", id="spawn-task")
            known = ", ".join(self._roles) if self._roles else "none defined in agents.toml"
            yield Label(f"Role (optional: {known})", markup=False)
            yield Input("", placeholder="the parent's settings", id="spawn-role")
            with Horizontal():
                yield Button("Cancel", id="spawn-cancel")
                yield Button("Spawn", variant="primary", id="spawn-ok")

    def on_mount(self) -> None:
        self.query_one("#spawn-task" if self._default_count else "#spawn-count", Input).focus()

    @on(Input.Submitted)
    @on(Button.Pressed, "#spawn-ok")
    def _spawn(self) -> None:
        count_text = self.query_one("#spawn-count", Input).value.strip()
        task = self.query_one("#spawn-task", Input).value.strip()
        count = int(count_text) if count_text.isdigit() else 0
        if not 1 <= count <= MAX_SUBAGENTS:
            self.notify(f"Spawn between 1 and {MAX_SUBAGENTS} subagents", severity="warning")
            return
        if not task:
            self.notify("Give the subagents a task", severity="warning")
            return
        role = self.query_one("#spawn-role", Input).value.strip() or None
        if role is not None and role not in self._roles:
            self.notify(f"No role {role!r}; known: {', '.join(self._roles) or 'none'}", severity="warning",
                        markup=False)
            return
        self.dismiss(SpawnSpec(count, task, role))

    @on(Button.Pressed, "#spawn-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
