"""Pilot tests: queued messages outlive a quit or crash; a closed or renamed pane's name is free
for the next new pane (scripted engine)."""

from __future__ import annotations

from magnitude_tui.store import Store
from tests.app_support import SIZE, ScriptedClient, make_app, queued_behind_a_reply, settle, wait_for


async def test_queued_messages_survive_a_quit_and_are_sent_on_resume(tmp_path):
    async with queued_behind_a_reply(tmp_path, "second", "third") as (_, _, pane):
        assert pane.queued == ["second", "third"]
        # In the store at once, not on the save timer: a crash right now loses nothing.
        assert Store(tmp_path / "magnitude.db").queued(pane.session_id) == ["second", "third"]
        session = pane.session_id
    # The app quit (or died) with the reply unfinished and two messages queued behind it.

    client = ScriptedClient()
    app = make_app(tmp_path, client, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        [pane] = app.workspace.grid.panes
        assert pane.session_id == session
        # The cut-off reply's end would have sent the first queued message: the resume does.
        await wait_for(pilot, lambda: len(client.submitted) == 1, what="the queued turn sent")
        assert client.submitted[0].messages[-1].content == "second"
        assert pane.queued == ["third"]
        await settle(pilot)
        note = pane.query_one(".queued-note")
        assert note.display and "queued: third" in str(note.render())
        assert Store(tmp_path / "magnitude.db").queued(session) == ["third"]
        client.run_to_completion()
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the last queued turn")
        assert client.submitted[1].messages[-1].content == "third"
        client.run_to_completion()
        await wait_for(pilot, lambda: not pane.busy and not pane.queued, what="all sent")
        assert Store(tmp_path / "magnitude.db").queued(session) == []


async def test_a_queue_stopped_with_esc_is_not_kept_as_queued(tmp_path):
    async with queued_behind_a_reply(tmp_path, "second") as (pilot, client, pane):
        await pilot.press("escape")
        client.run_to_completion()
        await wait_for(pilot, lambda: pane.composer.value == "second", what="the queued text back")
        assert Store(tmp_path / "magnitude.db").queued(pane.session_id) == []


async def test_closed_and_renamed_panes_free_their_names(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        grid = ws.grid
        await pilot.press("ctrl+n", "ctrl+n")
        await wait_for(pilot, lambda: len(grid.panes) == 3, what="three panes")
        assert [p.record.name for p in grid.panes] == ["A1", "A2", "A3"]
        ws.conversations.rename(grid.panes[0].session_id, "research")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: len(grid.panes) == 4, what="a fourth pane")
        assert grid.panes[-1].record.name == "A1"  # the name "research" replaced is free again
        a2 = grid.panes[1]
        grid.focus_pane(a2)
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: len(grid.panes) == 3, what="A2 closed")
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: len(grid.panes) == 4, what="a new pane")
        assert grid.panes[-1].record.name == "A2"  # the closed pane's name, taken again
        # Reopening the closed A2 while a new A2 is open gives it a name of its own.
        reopened = await ws.conversations.open(a2.session_id)
        assert reopened.record.name == "A2 (2)"
        names = [p.record.name for p in grid.panes]
        assert len(names) == len(set(names)) == 5
        # Renaming onto an open pane's name is refused; onto a free one, allowed.
        ws.conversations.rename(reopened.session_id, "A1")
        assert reopened.record.name == "A2 (2)"
