"""Provides the agent dialog: a pane's role, system prompt, temperature and max tokens."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from magnitude_tui.agents import AgentSettings, check_settings


class AgentDialog(ModalScreen[AgentSettings | None]):
    """Edits one pane's settings; typing a role from agents.toml fills in its definition.
    Empty temperature or max tokens mean the app's defaults (--temperature, --max-tokens)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]
    DEFAULT_CSS = """
    AgentDialog { align: center middle; }
    AgentDialog > Vertical { width: 80; height: auto; padding: 1 2; border: thick $accent;
                             background: $surface; }
    AgentDialog Label { margin: 1 0 0 0; color: $text-muted; }
    AgentDialog #agent-title { margin: 0; text-style: bold; color: $text; }
    AgentDialog #agent-system { height: 6; }
    AgentDialog .numbers { height: auto; }
    AgentDialog .numbers Vertical { width: 1fr; height: auto; }
    AgentDialog Horizontal.buttons { height: auto; margin-top: 1; align-horizontal: right; }
    AgentDialog Button { margin-left: 1; }
    """

    def __init__(self, pane_name: str, settings: AgentSettings, roles: dict[str, AgentSettings]) -> None:
        super().__init__()
        self._pane_name = pane_name
        self._settings = settings
        self._roles = roles

    def compose(self) -> ComposeResult:
        s = self._settings
        known = ", ".join(self._roles) if self._roles else "none: define them in agents.toml"
        with Vertical():
            yield Label(f"Agent settings of {self._pane_name} (from its next turn)", id="agent-title")
            yield Label(f"Role ({known})")
            yield Input(s.role or "", placeholder="no role", id="agent-role")
            yield Label("System prompt")
            yield TextArea(s.system, id="agent-system", soft_wrap=True, compact=True)
            with Horizontal(classes="numbers"):
                with Vertical():
                    yield Label("Temperature (empty: default)")
                    yield Input("" if s.temperature is None else f"{s.temperature:g}", id="agent-temperature")
                with Vertical():
                    yield Label("Max tokens (empty: default)")
                    yield Input("" if s.max_tokens is None else str(s.max_tokens), type="integer",
                                id="agent-max-tokens")
            with Horizontal(classes="buttons"):
                yield Button("Cancel", id="agent-cancel")
                yield Button("Save (ctrl+s)", variant="primary", id="agent-save")

    def on_mount(self) -> None:
        self.query_one("#agent-role", Input).focus()

    @on(Input.Changed, "#agent-role")
    def _role_typed(self, event: Input.Changed) -> None:
        role = self._roles.get(event.value.strip())
        if role is None:
            return
        self.query_one("#agent-system", TextArea).load_text(role.system)
        self.query_one("#agent-temperature", Input).value = "" if role.temperature is None else f"{role.temperature:g}"
        self.query_one("#agent-max-tokens", Input).value = "" if role.max_tokens is None else str(role.max_tokens)

    @on(Button.Pressed, "#agent-save")
    @on(Input.Submitted)
    def action_save(self) -> None:
        temperature_text = self.query_one("#agent-temperature", Input).value.strip()
        max_tokens_text = self.query_one("#agent-max-tokens", Input).value.strip()
        try:
            temperature = float(temperature_text) if temperature_text else None
            max_tokens = int(max_tokens_text) if max_tokens_text else None
            check_settings(temperature=temperature, max_tokens=max_tokens)
        except ValueError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            return
        role = self.query_one("#agent-role", Input).value.strip() or None
        system = self.query_one("#agent-system", TextArea).text.strip()
        self.dismiss(AgentSettings(role, system, temperature, max_tokens))

    @on(Button.Pressed, "#agent-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)
