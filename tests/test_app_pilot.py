"""Pilot tests: the real app, driven by keys, against a scripted engine stepped by the test."""

from __future__ import annotations

import sqlite3

from textual.command import CommandList

from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.loading_view import LoadingView
from magnitude_tui.widgets.pane_grid import PaneGrid, tiling
from magnitude_tui.widgets.scheduler_panel import SchedulerPanel
from magnitude_tui.widgets.sequences_panel import SequencesPanel
from scheduler.types import Phase
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, scripted_app, settle, type_message, wait_for


def _grid(app) -> PaneGrid:
    return app.workspace.grid


def _highlighted_command(app) -> str:
    lists = app.screen.query(CommandList)
    if not lists or lists.first().highlighted is None:
        return ""
    command_list = lists.first()
    return str(command_list.get_option_at_index(command_list.highlighted).prompt)


def _assistant(pane: ChatPane) -> list[str]:
    return [m.content for m in pane.record.messages if m.role == "assistant"]


async def test_submit_in_two_panes_both_stream(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "first question")
        await pilot.press("ctrl+n")
        await type_message(pilot, "second question")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="both submits")
        a1, a2 = _grid(app).panes
        assert [r.session_id for r in client.submitted] == [a1.session_id, a2.session_id]
        client.step(4)  # prefill, prefill->generating (1 token), 2 more tokens
        await settle(pilot)
        assert a1.busy and a2.busy
        assert _assistant(a1) == ["Echo **first question** "] and _assistant(a2)[0].startswith("Echo **second")
        assert a1.replies.last_update.phase is Phase.GENERATING
        client.run_to_completion()
        await settle(pilot)
        assert _assistant(a1) == ["Echo **first question** with `code` done."]
        assert _assistant(a2) == ["Echo **second question** with `code` done."]
        assert not a1.busy and a1.replies.last_update.phase is Phase.DONE


async def test_escape_cancels_focused_pane_only(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "one")
        await pilot.press("ctrl+n")
        await type_message(pilot, "two")
        a1, a2 = _grid(app).panes
        client.step(3)
        await settle(pilot)
        await pilot.press("shift+tab")  # back to A1
        assert _grid(app).focused_pane() is a1
        await pilot.press("escape")
        assert client.cancelled == [client.submitted[0].request_id]
        client.run_to_completion()
        await settle(pilot)
        assert a1.record.messages[-1].done_reason == "cancelled"
        assert a2.record.messages[-1].done_reason == "stop"
        assert _assistant(a2) == ["Echo **two** with `code` done."]


async def test_spawn_three_subagents_answers_come_back(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await one_turn(pilot, client, "plan a trip")
        parent = _grid(app).panes[0]
        await type_message(pilot, "/spawn 3 list one risk")
        await wait_for(pilot, lambda: len(client.submitted) == 4, what="three subagent submits")
        children = _grid(app).panes[1:]
        assert [c.record.name for c in children] == ["A1.1", "A1.2", "A1.3"]
        forks = client.submitted[1:]
        assert all(r.fork_from == parent.session_id for r in forks)
        # Each child starts from the parent's conversation, then its task.
        assert all(r.messages[:2] == parent.conversation() for r in forks)
        assert all("list one risk" in r.messages[-1].content for r in forks)
        client.run_to_completion()
        await wait_for(pilot, lambda: len([m for m in parent.record.messages if m.author]) == 3,
                       what="three answers posted back")
        results = [m for m in parent.record.messages if m.author]
        assert sorted(m.author for m in results) == ["A1.1", "A1.2", "A1.3"]
        assert all("Echo" in m.content for m in results)
        # Posted back once, even if a child is asked something else afterwards.
        _grid(app).focus_pane(children[0])
        await type_message(pilot, "more?")
        await wait_for(pilot, lambda: len(client.submitted) == 5, what="the follow-up's submit")
        client.run_to_completion()
        await settle(pilot)
        await wait_for(pilot, lambda: children[0].record.messages[-1].complete, what="the follow-up's reply")
        await settle(pilot)
        assert len([m for m in parent.record.messages if m.author]) == 3


async def test_spawn_dialog_and_burst(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press(*"check facts", "enter")
        await wait_for(pilot, lambda: len(client.submitted) == 3, what="the dialog's subagents")
        assert len(_grid(app).panes) == 4
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: len(client.submitted) == 11, what="the burst's 8 submits")
        assert len(_grid(app).panes) == 12
        assert len(client.submitted) == 11
        assert _grid(app).styles.grid_size_columns == 4
        await pilot.press("f2")
        client.step(2)
        await settle(pilot)
        panel = app.workspace.query_one(SequencesPanel)
        await wait_for(pilot, lambda: len(panel.live_sessions) == 11, what="a row per live sequence")
        assert panel.display


async def test_close_pane_frees_its_sequence(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.press("ctrl+n")
        await type_message(pilot, "busy one")
        client.step(3)
        await settle(pilot)
        pane = _grid(app).panes[1]
        await pilot.press("ctrl+x")  # it is replying: the app asks first
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is app.workspace, what="the dialog to close")
        assert len(_grid(app).panes) == 2 and pane.busy and not client.cancelled
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: len(_grid(app).panes) == 1, what="the pane to close")
        assert client.cancelled == [client.submitted[0].request_id]
        assert client.closed_sessions == [pane.session_id]
        assert len(_grid(app).panes) == 1
        assert pane.session_id not in app.workspace.query_one(SequencesPanel)._rows
        closed = app.store._db.execute("SELECT closed FROM panes WHERE id = ?", (pane.session_id,)).fetchone()
        assert closed[0] is not None
        await pilot.press("ctrl+x")  # closing the last pane leaves a fresh one, with a free name
        await wait_for(pilot, lambda: [p.record.name for p in _grid(app).panes] == ["A1"], what="a fresh pane")
        assert [p.record.name for p in _grid(app).panes] == ["A1"]


async def test_policy_switch_takes_effect(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("down", "enter")  # target:50 -> target:100
        await wait_for(pilot, lambda: client.policy == "target:100", what="the dialog's policy")
        await settle(pilot)
        assert app.workspace.query_one(SchedulerPanel).policy == "target:100"
        await type_message(pilot, "/policy prefill-first")
        await wait_for(pilot, lambda: app.workspace.policy == "prefill-first", what="the slash command's policy")
        await type_message(pilot, "/policy sometimes")
        await settle(pilot)
        assert client.policy == "prefill-first"


async def test_theme_switch_takes_effect_and_is_remembered(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "magnitude"
        await pilot.press("ctrl+t")
        await pilot.pause()
        await pilot.press(*"paper")
        await wait_for(pilot, lambda: "paper" in _highlighted_command(app), what="the palette's search")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.theme == "magnitude-paper", what="the theme")
        assert app.current_theme.dark is False
    app2 = make_app(tmp_path)
    async with app2.run_test(size=SIZE):
        assert app2.theme == "magnitude-paper"


async def test_zoom_and_tiling(tmp_path):
    assert [tiling(n) for n in (1, 2, 3, 4, 5, 9, 10, 16)] == [
        (1, 1), (2, 1), (2, 2), (2, 2), (3, 2), (3, 3), (4, 3), (4, 4)]
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+n", "ctrl+n")
        grid = _grid(app)
        a3 = grid.panes[2]
        await pilot.press("ctrl+o")
        assert grid.zoomed == a3.session_id
        await wait_for(pilot, lambda: [p.region.width > 70 for p in grid.panes] == [False, False, True],
                       what="the zoomed layout")
        await pilot.press("tab")  # next pane while zoomed: the zoom follows focus
        assert grid.zoomed == grid.panes[0].session_id
        await pilot.press("ctrl+o")
        assert grid.zoomed is None


async def test_export_and_copy(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await one_turn(pilot, client, "write code")
        await pilot.press("ctrl+y")
        assert app.clipboard == "Echo **write code** with `code` done."
        await pilot.press("f5")
        [path] = list((tmp_path / "exports").glob("*.md"))
        text = path.read_text()
        assert text.startswith("# A1 · main") and "## user\n\nwrite code" in text and "## assistant" in text


async def test_loading_view_then_ready(tmp_path):
    client = ScriptedClient(auto_ready=False)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        view = app.workspace.query_one(LoadingView)
        assert view.display
        assert view.query_one("ProgressBar").progress == 40
        client.ready()
        await wait_for(pilot, lambda: not view.display, what="the loading view to go")


async def test_engine_death_fails_live_request_and_restarts(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "hello")
        client.step(3)
        client.die()
        await settle(pilot)
        pane = _grid(app).panes[0]
        assert not pane.busy
        assert pane.record.messages[-1].done_reason == "error"
        assert not app.workspace.engine_ready
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: client.started == 2 and app.workspace.engine_ready, what="the restart")


async def test_palette_lists_every_action(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE):
        titles = {c.title for c in app.get_system_commands(app.workspace)}
    for title in ("New pane", "Close pane", "Next pane", "Previous pane", "Zoom pane", "Cancel generation",
                  "Spawn subagents", "Burst spawn 8", "Switch policy", "Theme", "Export conversation",
                  "Copy last answer", "Toggle sequences panel", "Toggle scheduler panel"):
        assert title in titles


async def test_partial_reply_saved_while_streaming_and_restored_once(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "tell me")
        client.step(4)
        await settle(pilot)
        db = sqlite3.connect(tmp_path / "magnitude.db")
        saved = lambda: db.execute("SELECT role, content, complete FROM messages ORDER BY id").fetchall()  # noqa: E731
        # The save tick (every 0.5 s) puts the partial reply on disk.
        await wait_for(pilot, lambda: saved() == [("user", "tell me", 1), ("assistant", "Echo **tell me** ", 0)],
                       what="the partial reply on disk")
        await pilot.press("ctrl+n")
        await one_turn(pilot, client, "second pane")
    # Restart with --resume: the same panes and messages, each once.
    for _ in range(2):
        app = make_app(tmp_path, resume=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: len(_grid(app).panes) == 2, what="the restored panes")
            panes = _grid(app).panes
            assert [p.record.name for p in panes] == ["A1", "A2"]
            assert [(m.role, m.content) for m in panes[0].record.messages] == [
                ("user", "tell me"), ("assistant", "Echo **tell me** with `code` done.")]
            assert len(panes[1].record.messages) == 2
    count = sqlite3.connect(tmp_path / "magnitude.db").execute("SELECT COUNT(*) FROM messages").fetchone()
    assert count == (4,)


def test_app_does_not_import_llama_cpp():
    import subprocess
    import sys

    code = ("import sys, magnitude_tui.app, magnitude_tui.engine.client; "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_finished_rows_leave_the_sequences_panel_after_a_while(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.pause()
        panel = app.workspace.sequences_panel
        now = [100.0]
        panel.clock = lambda: now[0]
        await type_message(pilot, "one")
        await pilot.press("ctrl+n")
        await type_message(pilot, "two")
        client.step(2)
        client.cancel(client.submitted[0].request_id)
        client.step(1)  # the first finishes (cancelled); the second keeps generating
        await settle(pilot)
        assert len(panel._rows) == 2
        now[0] += 3.0
        panel.refresh_rows()
        assert len(panel._rows) == 2  # still readable shortly after it finished
        now[0] += 2.0
        panel.refresh_rows()
        assert panel.live_sessions == [client.submitted[1].session_id]
        assert list(panel._rows) == [client.submitted[1].session_id]


async def test_a_pasted_block_is_sent_whole(tmp_path):
    # The composer is a TextArea: a paste of several lines goes in whole (terminals paste line
    # breaks as CR), is sent whole and shown as written.
    from textual import events

    async with scripted_app(tmp_path) as (app, client, pilot):
        composer = _grid(app).panes[0].composer
        await pilot.press(*"Fix: ")
        composer.post_message(events.Paste("def f(x):\r\n    return x +\r\n"))
        await pilot.pause()
        assert composer.value == "Fix: def f(x):\n    return x +\n"
        composer.post_message(events.Paste("one line"))
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(client.submitted) == 1, what="the submit")
        assert client.submitted[0].messages[-1].content == "Fix: def f(x):\n    return x +\none line"
        assert composer.value == ""
        # Shown as written: line breaks and indentation kept (as Markdown they would collapse).
        pane = _grid(app).panes[0]
        await wait_for(pilot, lambda: pane.query(".plain"), what="the user's message on screen")
        plain = pane.query_one(".plain")
        await wait_for(pilot, lambda: plain.size.height >= 3, what="its layout")
        rows = [plain.render_line(y).text.rstrip() for y in range(3)]
        assert rows == ["Fix: def f(x):", "    return x +", "one line"]


async def test_scheduler_panel_gives_way_on_a_narrow_terminal_until_toggled(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        panel = app.workspace.scheduler_panel
        await wait_for(pilot, lambda: not panel.display, what="the panel hidden at 80 columns")
        await pilot.resize_terminal(140, 40)
        await wait_for(pilot, lambda: panel.display, what="the panel back at 140 columns")
        pane = _grid(app).panes[0]
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: not panel.display and pane.region.width > 70, what="the chat taking the width")
        await pilot.press("f3")  # the user's choice stands whatever the width
        assert panel.display
        await pilot.resize_terminal(90, 24)
        await wait_for(pilot, lambda: app.screen.size.width == 90 and pane.region.width < 50,
                       what="the layout at 90 columns, beside the panel")
        assert panel.display
