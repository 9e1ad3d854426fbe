"""Pilot tests for a day at the keyboard: failures that say why, typing while a reply streams,
closing and reopening panes, focus, and the scheduler panel's rate (scripted engine)."""

from __future__ import annotations

import sqlite3

from textual import events

from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.screens.conversation_list import ConversationList
from magnitude_tui.widgets.loading_view import LoadingView
from magnitude_tui.widgets.status_line import StatusLine
from scheduler.types import Phase
from tests.app_support import (
    SIZE,
    ScriptedClient,
    make_app,
    one_turn,
    queued_behind_a_reply,
    scripted_app,
    settle,
    type_message,
    wait_for,
)


def _burst(app, keys: list[str]) -> None:
    """Keys as a terminal delivers a fast burst (tmux send-keys, a paste of keystrokes): all of
    them queued before the app handles the first, which pilot.press never does."""
    for key in keys:
        char = key if len(key) == 1 else {"space": " "}.get(key)
        app._driver.send_message(events.Key(key, char))


async def test_a_failed_start_shows_its_reason_and_quitting_exits_non_zero(tmp_path):
    client = ScriptedClient(auto_ready=False)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        client.fail_to_start("engine failed to start: unknown device 'bogus': use auto, cpu, vulkan or vulkan:N")
        await settle(pilot)
        status = str(app.workspace.query_one(LoadingView).query_one("#loading-status").render())
        assert "unknown device 'bogus'" in status and "exited with code" not in status
        assert app.failure.startswith("engine failed to start")
        await pilot.press("ctrl+q")
    assert app.return_code == 1


async def test_quitting_a_running_app_exits_zero(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_enter_while_replying_queues_the_message_as_the_next_turn(tmp_path):
    async with queued_behind_a_reply(tmp_path, "second") as (pilot, client, pane):
        assert pane.composer.value == "" and pane.queued == ["second"]
        note = pane.query_one(".queued-note")
        assert note.display and "queued: second" in str(note.render())
        assert len(client.submitted) == 1  # nothing sent while the reply streams
        client.run_to_completion()
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the queued turn")
        assert client.submitted[1].messages[-1].content == "second"
        assert [m.content for m in client.submitted[1].messages][::2] == ["first", "second"]
        await settle(pilot)
        assert not note.display
        # Esc stops the reply; what was queued returns to the composer instead of being sent.
        client.step(3)
        await settle(pilot)
        await type_message(pilot, "third")
        assert pane.queued == ["third"]
        await pilot.press("escape")
        client.run_to_completion()
        await settle(pilot)
        await wait_for(pilot, lambda: pane.composer.value == "third", what="the queued text back")
        assert len(client.submitted) == 2 and not pane.queued


async def test_keys_typed_right_after_enter_start_the_next_message(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.press("ctrl+n")
        a1, a2 = app.workspace.grid.panes
        _burst(app, [*"What is 2+2?", "enter", *"Now", "shift+tab", *"ok"])
        await wait_for(pilot, lambda: a1.composer.value == "ok" and client.submitted, what="the burst")
        assert [r.messages[-1].content for r in client.submitted] == ["What is 2+2?"]
        assert client.submitted[0].session_id == a2.session_id
        assert a2.composer.value == "Now"
        assert app.workspace.grid.focused_pane() is a1


async def test_the_scheduler_rate_is_the_panes_sum_and_clears_when_nothing_runs(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        panel = app.workspace.scheduler_panel
        await type_message(pilot, "one")
        await pilot.press("ctrl+n")
        await type_message(pilot, "two")
        client.step(3)
        await settle(pilot)
        panes = app.workspace.grid.panes
        assert panel.rate == sum(p.replies.last_update.tok_s_live for p in panes) == 40.0
        assert "40.0 tok/s" in str(panel.render())
        client.run_to_completion()
        await settle(pilot)
        assert panel.rate is None and "nothing generating" in str(panel.render())
        await type_message(pilot, "three")
        client.step(3)
        client.die()
        await settle(pilot)
        assert panel.rate is None and "engine stopped" in str(panel.render())


async def test_closing_a_replying_pane_asks_first_and_closed_panes_reopen(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        grid = app.workspace.grid
        await pilot.press("ctrl+n")
        await type_message(pilot, "keep me")
        client.step(3)
        await settle(pilot)
        a2 = grid.panes[1]
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("enter")  # focus starts on "Keep": a stray enter closes nothing
        await wait_for(pilot, lambda: app.screen is app.workspace, what="the dialog gone")
        assert len(grid.panes) == 2 and a2.busy
        await pilot.press("ctrl+x", "y")
        await wait_for(pilot, lambda: len(grid.panes) == 1, what="A2 closed")
        client.run_to_completion()
        await settle(pilot)
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        rows = app.screen.rows
        assert [(r.name, r.is_open) for r in rows] == [("A2", False), ("A1", True)]
        await pilot.press(*"keep")  # search: only A2 said "keep me"
        await wait_for(pilot, lambda: [r.name for r in app.screen.rows] == ["A2"], what="the search")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(grid.panes) == 2, what="A2 reopened")
        reopened = grid.panes[1]
        assert reopened.record.name == "A2" and reopened.record.messages[0].content == "keep me"
        assert grid.focused_pane() is reopened
        # An idle pane closes at once.
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: len(grid.panes) == 1, what="the idle pane closed")


async def test_the_conversation_list_renames_and_deletes(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await one_turn(pilot, client, "hello")
        pane = app.workspace.grid.panes[0]
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        await pilot.press("f2", "ctrl+u", *"research", "enter")
        await wait_for(pilot, lambda: pane.record.name == "research", what="the rename")
        assert pane.border_title.startswith("research")
        await pilot.press("ctrl+n", "f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        await pilot.press(*"research")
        await wait_for(pilot, lambda: [r.name for r in app.screen.rows] == ["research"], what="the search")
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 1, what="the pane gone")
        db = sqlite3.connect(tmp_path / "magnitude.db")
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)
        assert [r[0] for r in db.execute("SELECT id FROM panes")] == [app.workspace.grid.panes[0].session_id]


async def test_focus_stays_on_the_pane_after_a_restart(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await pilot.press("ctrl+n", "ctrl+n", "shift+tab")
        grid = app.workspace.grid
        a2 = grid.panes[1]
        assert grid.focused_pane() is a2
        client.die()
        await settle(pilot)
        client.auto_ready = False  # a real worker takes seconds to load
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.workspace.loading_view.display, what="the loading view")
        await pilot.pause()
        client.ready()
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the restart")
        await pilot.pause()
        assert grid.focused_pane() is a2
        await type_message(pilot, "still here")
        await wait_for(pilot, lambda: client.submitted, what="the submit")
        assert client.submitted[0].session_id == a2.session_id


async def test_quit_is_in_the_footer_and_help_keeps_its_brackets(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        quit_key = app.workspace.active_bindings["ctrl+q"].binding
        assert quit_key.show and quit_key.description == "Quit"
        footer = app.workspace.query_one("Footer")
        assert any("Quit" in str(item.render()) for item in footer.query("FooterKey"))
        await type_message(pilot, "/help")
        await wait_for(pilot, lambda: app.screen.query("Toast"), what="the help toast")
        shown = " ".join(str(t.render()) for t in app.screen.query("Toast"))
        assert "/burst [N]" in shown


def test_the_status_line_says_nothing_about_cache_before_admission():
    preparing = SeqUpdate("r", "s", None, Phase.PREPARING, prompt_total=78)
    text = StatusLine.metrics_text(preparing)
    assert "cached" not in text and "78 prompt tokens" in text
    prefill = SeqUpdate("r", "s", 1, Phase.PREFILL, prompt_total=78, prompt_done=40, cached_tokens=30)
    assert "40/78 (30 cached)" in StatusLine.metrics_text(prefill)


async def test_an_export_marks_a_reply_that_is_still_streaming(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "write")
        client.step(3)
        await settle(pilot)
        await pilot.press("f5")
        [path] = list((tmp_path / "exports").glob("*.md"))
        assert "## assistant (partial: still streaming)" in path.read_text()


async def test_a_reply_cancelled_before_it_began_takes_its_prompt_out_of_the_context(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "never mind")
        await pilot.press("escape")
        client.step()
        await settle(pilot)
        await wait_for(pilot, lambda: pane.composer.value == "never mind", what="the prompt back")
        assert pane.record.messages == [] and pane.conversation() == ()
        app.workspace.save()
        db = sqlite3.connect(tmp_path / "magnitude.db")
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (0,)


async def test_a_subagent_frees_its_kv_once_its_answer_is_posted(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        await type_message(pilot, "/spawn 2 check")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the spawn")
        children = app.workspace.grid.panes[1:]
        client.run_to_completion()
        await settle(pilot)
        await wait_for(pilot, lambda: set(client.closed_sessions) == {c.session_id for c in children},
                       what="the subagents' sessions closed")
        assert len(app.workspace.grid.panes) == 3  # still open to read


async def test_a_full_context_drops_the_oldest_turns_and_says_so(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        pane = app.workspace.grid.panes[0]
        assert pane.replies.context_size == 8192  # from EngineReady
        for text in ("one", "two", "three"):
            await one_turn(pilot, client, text)
        assert pane.border_subtitle.startswith("ctx ") and pane.border_subtitle.endswith("/8192")
        client.drop_next = 4  # the engine had to leave out the two oldest turns
        await one_turn(pilot, client, "four")
        note = pane.query_one(".context-note")
        assert "the oldest 2 turns (4 messages)" in str(note.render())
        assert len(pane.query("MessageView.-dropped")) == 4
        await type_message(pilot, "five")
        await wait_for(pilot, lambda: len(client.submitted) == 5, what="the next turn")
        sent = [m.content for m in client.submitted[-1].messages]
        assert sent[0] == "three" and sent[-1] == "five" and "one" not in sent


async def test_up_edits_the_last_message_and_the_reply_is_regenerated(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        pane = app.workspace.grid.panes[0]
        await one_turn(pilot, client, "What is 2+3?")
        await pilot.press("up")  # empty composer: the last message comes back
        assert pane.composer.value == "What is 2+3?" and pane.editing is not None
        assert "editing your last message" in str(pane.query_one(".queued-note").render())
        await pilot.press("backspace", "backspace", *"4?", "enter")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the edited turn")
        assert [m.content for m in client.submitted[1].messages] == ["What is 2+4?"]
        client.run_to_completion()
        await settle(pilot)
        assert [(m.role, m.content[:12]) for m in pane.record.messages] == [
            ("user", "What is 2+4?"), ("assistant", "Echo **What ")]
        app.workspace.save()
        db = sqlite3.connect(tmp_path / "magnitude.db")
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone() == (2,)


async def test_retry_replaces_the_last_reply(tmp_path):
    replies = iter(["first answer", "second answer"])
    client = ScriptedClient(reply=lambda request: next(replies))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        await one_turn(pilot, client, "hi")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the retry")
        assert [m.content for m in client.submitted[1].messages] == ["hi"]
        client.run_to_completion()
        await settle(pilot)
        assert [m.content for m in pane.record.messages] == ["hi", "second answer"]


async def test_shift_enter_and_ctrl_j_start_a_new_line(tmp_path):
    async with scripted_app(tmp_path) as (app, client, pilot):
        pane = app.workspace.grid.panes[0]
        await pilot.press(*"line one", "shift+enter", *"two", "ctrl+j", *"three")
        assert pane.composer.value == "line one\ntwo\nthree" and not client.submitted
        await pilot.press("enter")
        await wait_for(pilot, lambda: client.submitted, what="the submit")
        assert client.submitted[0].messages[-1].content == "line one\ntwo\nthree"


async def test_ctrl_c_stops_the_reply_unless_text_is_selected_and_otherwise_says_how_to_quit(tmp_path):
    async with queued_behind_a_reply(tmp_path) as (pilot, client, pane):
        rid = pane.replies.request_id
        assert rid is not None and pane.composer.value == ""
        await pilot.press(*"keep this")
        pane.composer.select_all()
        await pilot.press("ctrl+c")  # a selection: copied, the reply goes on
        assert client.cancelled == [] and pane.composer.value == "keep this"
        assert pilot.app.clipboard == "keep this"
        pane.composer.move_cursor(pane.composer.document.end)
        await pilot.press("ctrl+c")  # nothing selected: the reply stops, as esc stops it
        assert client.cancelled == [rid]
        client.run_to_completion()
        await wait_for(pilot, lambda: pane.replies.request_id is None, what="the stopped reply")
        notes = len(pilot.app._notifications)
        await pilot.press("ctrl+c")  # nothing runs: how to quit, and nothing else
        assert client.cancelled == [rid] and len(pilot.app._notifications) == notes + 1
        assert "to quit" in list(pilot.app._notifications)[-1].message
