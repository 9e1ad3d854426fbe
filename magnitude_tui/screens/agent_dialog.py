"""Provides the agent dialog: a pane's role, system prompt and sampling (temperature, max tokens,
top_p, min_p)."""

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
    An empty number means the app's default (--temperature, --max-tokens; top_p 0.95, min_p 0.05)."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save", priority=True)]
    DEFAULT_CSS = """
    AgentDialog { align: center middle; }
    AgentDialog > Vertical { width: 80; height: auto; max-width: 100%; max-height: 100%; overflow-y: auto; padding: 1 2; border: thick $accent;
                             background: $surface; }
    AgentDialog Label { margin: 1 0 0 0; color: $text-muted; }
    AgentDialog #agent-title { margin: 0; text-style: bold; color: $text; }
    AgentDialog #agent-system { height: 6; }
    AgentDialog .numbers { height: auto; }
    AgentDialog .numbers Vertical { width: 1fr; height: auto; }
    AgentDialog .numbers Label { margin: 0; }
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
            yield Label(f"Agent settings of {self._pane_name} (from its next turn)", id="agent-title", markup=False)
            yield Label(f"Role ({known})", markup=False)
            yield Input(s.role or "", placeholder="no role", id="agent-role")
            yield Label("System prompt")
            yield TextArea(s.system, id="agent-system", soft_wrap=True, compact=True)
            yield Label("Sampling (empty: the app's default)")
            with Horizontal(classes="numbers"):
                for label, key, value in (("Temperature", "temperature", s.temperature),
                                          ("Max tokens", "max-tokens", s.max_tokens),
                                          ("top_p", "top-p", s.top_p), ("min_p", "min-p", s.min_p)):
                    with Vertical():
                        yield Label(label)
                        yield Input(_shown(value), type="integer" if key == "max-tokens" else "text",
                                    id=f"agent-{key}")
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
        for key, value in (("temperature", role.temperature), ("max-tokens", role.max_tokens),
                           ("top-p", role.top_p), ("min-p", role.min_p)):
            self.query_one(f"#agent-{key}", Input).value = _shown(value)

    @on(Button.Pressed, "#agent-save")
    @on(Input.Submitted)
    def action_save(self) -> None:
        def number(key: str, kind=float):
            text = self.query_one(f"#agent-{key}", Input).value.strip()
            try:
                return kind(text) if text else None
            except ValueError:
                raise ValueError(f"{key.replace('-', '_')}: {text!r} is not a number") from None

        try:
            temperature, max_tokens = number("temperature"), number("max-tokens", int)
            top_p, min_p = number("top-p"), number("min-p")
            check_settings(temperature=temperature, max_tokens=max_tokens, top_p=top_p, min_p=min_p)
        except ValueError as exc:
            self.notify(str(exc), severity="warning", markup=False)
            return
        role = self.query_one("#agent-role", Input).value.strip() or None
        system = self.query_one("#agent-system", TextArea).text.strip()
        self.dismiss(AgentSettings(role, system, temperature, max_tokens, top_p, min_p))

    @on(Button.Pressed, "#agent-cancel")
    def _cancel(self) -> None:
        self.dismiss(None)


def _shown(value: float | int | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
