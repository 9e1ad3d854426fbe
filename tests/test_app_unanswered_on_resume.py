"""A message the quit cut off before its reply began (no token yet) came back on --resume with
nothing under it and no word of why; the pane now says it was not answered and how to send it
again. A message with its answer, or a reply cut off mid-way (marked interrupted), says nothing."""

from __future__ import annotations

from textual.widgets import Static

from magnitude_tui.store import MessageRecord, PaneRecord, Store
from tests.app_support import SIZE, make_app, settle


def _notes(pane) -> list[str]:
    return [str(s.render()) for s in pane.query(Static) if s.has_class("context-note")]


def _saved(tmp_path, *messages: MessageRecord) -> None:
    store = Store(tmp_path / "magnitude.db")
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=list(messages)))
    store.close()


async def test_a_message_left_unanswered_by_a_quit_says_so_on_resume(tmp_path):
    _saved(tmp_path, MessageRecord("user", "hello"), MessageRecord("assistant", "hi"),
           MessageRecord("user", "and the weather?"))
    app = make_app(tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        [pane] = app.workspace.grid.panes
        [note] = _notes(pane)
        assert note.startswith("not answered: the app ended before this message's reply began")
        await pilot.press("up")  # what the note says: the message comes back to be sent again
        assert pane.composer.text == "and the weather?"


async def test_an_answered_conversation_says_nothing_on_resume(tmp_path):
    _saved(tmp_path, MessageRecord("user", "hello"), MessageRecord("assistant", "hi"))
    app = make_app(tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        [pane] = app.workspace.grid.panes
        assert _notes(pane) == []
