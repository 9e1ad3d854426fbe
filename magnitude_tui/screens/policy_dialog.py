"""Provides the policy dialog: pick a scheduling policy or type one."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from magnitude_tui.commands import PRESETS, policy_problem


class PolicyDialog(ModalScreen[str | None]):
    """Returns the chosen policy string (validated) or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    PolicyDialog { align: center middle; }
    PolicyDialog > Vertical { width: 72; height: auto; max-width: 100%; max-height: 100%; overflow-y: auto; padding: 1 2; border: thick $accent;
                              background: $surface; }
    PolicyDialog OptionList { height: auto; max-height: 10; margin: 1 0; }
    PolicyDialog Label { color: $text-muted; }
    """

    def __init__(self, current: str) -> None:
        super().__init__()
        self._current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Scheduling policy (now {self._current})")
            yield OptionList(*(Option(f"{name:<14} {why}", id=name) for name, why in PRESETS))
            yield Label("or type one: prefill-first · fixed:N · target:MS")
            yield Input(placeholder="target:40", id="policy-custom")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        names = [name for name, _ in PRESETS]
        options.highlighted = names.index(self._current) if self._current in names else 0
        options.focus()

    @on(OptionList.OptionSelected)
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    @on(Input.Submitted)
    def _typed(self, event: Input.Submitted) -> None:
        policy = event.value.strip()
        problem = policy_problem(policy)
        if problem is None:
            self.dismiss(policy)
        else:
            self.notify(f"Not a policy: {problem}", severity="warning", markup=False)  # it quotes the text
