"""Provides a yes/no dialog for actions that throw work away (closing a pane that is replying)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmDialog(ModalScreen[bool]):
    """Asks one question; y or enter confirms, n or esc keeps things as they are."""

    BINDINGS = [
        Binding("escape,n", "dismiss(False)", "Keep"),
        Binding("y", "dismiss(True)", "Confirm"),
    ]
    DEFAULT_CSS = """
    ConfirmDialog { align: center middle; }
    ConfirmDialog > Vertical { width: 64; height: auto; max-width: 100%; max-height: 100%; overflow-y: auto; padding: 1 2; border: thick $warning;
                               background: $surface; }
    /* A Label is as wide as its text unless told otherwise: the detail ran past the box. */
    ConfirmDialog Label { width: 100%; }
    ConfirmDialog #confirm-title { text-style: bold; }
    ConfirmDialog #confirm-detail { color: $text-muted; margin-top: 1; }
    ConfirmDialog Horizontal { height: auto; margin-top: 1; align-horizontal: right; }
    ConfirmDialog Button { margin-left: 1; }
    """

    def __init__(self, title: str, detail: str, *, confirm: str = "Yes") -> None:
        super().__init__()
        self._title, self._detail, self._confirm = title, detail, confirm

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self._title, id="confirm-title", markup=False)
            yield Label(self._detail, id="confirm-detail", markup=False)
            with Horizontal():
                yield Button("Keep (n)", id="confirm-no")
                yield Button(f"{self._confirm} (y)", variant="warning", id="confirm-yes")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()  # a stray enter keeps the work

    @on(Button.Pressed, "#confirm-yes")
    def _yes(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def _no(self) -> None:
        self.dismiss(False)
