"""Provides the conversation list: every saved conversation, searchable; open, rename or delete one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from magnitude_tui.store import ConversationRow
from magnitude_tui.widgets.format import visible


class ListAction(Enum):
    OPEN = "open"  # focus it, or reopen it as a pane when it is closed
    OPEN_WORKSPACE = "open workspace"  # reopen every pane that was open in its workspace
    RENAME = "rename"
    DELETE = "delete"


@dataclass(frozen=True)
class ListChoice:
    action: ListAction
    row: ConversationRow
    name: str = ""  # the new name (RENAME)


def describe(row: ConversationRow, now: float) -> str:
    """One line: name, state, size, age, and what the conversation began with."""
    state = "open" if row.is_open else "closed"
    age = now - row.updated
    when = (f"{age / 60:.0f} min ago" if age < 3600 else f"{age / 3600:.0f} h ago" if age < 86400
            else time.strftime("%Y-%m-%d", time.localtime(row.updated)))
    role = " · subagent" if row.role == "subagent" else ""
    preview = row.preview or "(no messages)"
    found = f"  · “{row.match}”" if row.match else ""  # the search hit deeper in the transcript
    return (f"{row.name:<10} {state:<6} w{row.workspace_id:<3} {row.messages:>3} msgs  {when:>11}{role}  "
            f"{preview}{found}")


class ConversationList(ModalScreen[ListChoice | None]):
    """Type to search; enter opens (a closed one comes back as a pane), f3 reopens every pane of
    its workspace (wN, the launch it belongs to), f2 renames, ctrl+d deletes."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("down", "move(1)", "Down", show=False),
        Binding("up", "move(-1)", "Up", show=False),
        # The search box has the focus and takes no paging keys: without these a long list was
        # walked a row at a time.
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("f2", "rename", "Rename"),
        Binding("f3", "open_workspace", "Open its workspace"),
        # Priority: the search box would otherwise take ctrl+d (delete right).
        Binding("ctrl+d", "delete", "Delete", priority=True),
    ]
    DEFAULT_CSS = """
    ConversationList { align: center middle; }
    ConversationList > Vertical { width: 96; max-width: 100%; height: 80%; padding: 0 1; border: thick $accent;
                                  background: $surface; }
    ConversationList #list-title { text-style: bold; margin: 0 0 1 0; }
    ConversationList #list-help { color: $text-muted; margin-top: 1; width: 100%; }
    ConversationList OptionList { height: 1fr; border: none; }
    """

    def __init__(self, load: Callable[[str], list[ConversationRow]], *, clock=time.time) -> None:
        super().__init__()
        self._load = load
        self._clock = clock
        self.rows: list[ConversationRow] = []
        self._renaming: ConversationRow | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations", id="list-title", markup=False)
            yield Input(placeholder="search names and messages", id="list-search")
            yield OptionList(id="list-rows")
            yield Label("enter open or reopen · f3 its whole workspace (wN) · f2 rename · ctrl+d delete · "
                        "esc close", id="list-help")

    def on_mount(self) -> None:
        self._fill("")
        self.query_one("#list-search", Input).focus()

    def _fill(self, search: str) -> None:
        self.rows = self._load(search)
        options = self.query_one("#list-rows", OptionList)
        options.clear_options()
        now = self._clock()
        # As plain text: names and previews are what users typed ("[/b]" as markup ended the app).
        options.add_options([Option(Text(visible(describe(r, now))), id=r.id) for r in self.rows])
        if self.rows:
            options.highlighted = 0

    @property
    def selected(self) -> ConversationRow | None:
        index = self.query_one("#list-rows", OptionList).highlighted
        return self.rows[index] if index is not None and index < len(self.rows) else None

    @on(Input.Changed, "#list-search")
    def _search(self, event: Input.Changed) -> None:
        if self._renaming is None:
            self._fill(event.value)

    @on(Input.Submitted, "#list-search")
    def _submit(self, event: Input.Submitted) -> None:
        if self._renaming is not None:
            name = event.value.strip()
            if name:
                self.dismiss(ListChoice(ListAction.RENAME, self._renaming, name))
            return
        if self.selected is not None:
            self.dismiss(ListChoice(ListAction.OPEN, self.selected))

    @on(OptionList.OptionSelected)
    def _picked(self) -> None:
        if self.selected is not None:
            self.dismiss(ListChoice(ListAction.OPEN, self.selected))

    def action_move(self, step: int) -> None:
        options = self.query_one("#list-rows", OptionList)
        if self.rows:
            options.highlighted = ((options.highlighted or 0) + step) % len(self.rows)

    def action_page(self, step: int) -> None:
        """A page of rows down (1) or up (-1), stopping at the first and last row."""
        options = self.query_one("#list-rows", OptionList)
        if self.rows:
            page = max(1, options.scrollable_content_region.height - 1)
            options.highlighted = max(0, min(len(self.rows) - 1, (options.highlighted or 0) + step * page))

    def action_rename(self) -> None:
        row = self.selected
        if row is None:
            return
        self._renaming = row
        search = self.query_one("#list-search", Input)
        search.placeholder = f"new name for {row.name}, then enter"
        search.value = row.name
        self.query_one("#list-title", Label).update(f"Rename {row.name}")

    def action_open_workspace(self) -> None:
        if self.selected is not None:
            self.dismiss(ListChoice(ListAction.OPEN_WORKSPACE, self.selected))

    def action_delete(self) -> None:
        if self.selected is not None:
            self.dismiss(ListChoice(ListAction.DELETE, self.selected))

    def action_close(self) -> None:
        self.dismiss(None)
