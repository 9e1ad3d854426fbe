"""A long conversation keeps only its latest messages as widgets: the rest are a line at the top
of the transcript, shown again a stretch at a time on Page Up at the top (or a click)."""

from __future__ import annotations

from magnitude_tui.store import MessageRecord
from magnitude_tui.widgets.message_view import MessageView
from magnitude_tui.widgets.transcript import MIN_SHOWN, Transcript, shown_from
from tests.app_support import ScriptedClient, make_app, one_turn, settle, wait_for

# A tall reply, as agents write them: a short list, then a block of code (a long list would lay out
# as many widgets as it has items, and make every frame of these tests slow to no purpose).
PARAGRAPH = ("A finished reply with a list in it:\n\n1. item number 1 of the list\n2. item number 2 of the list\n\n"
             "```\n" + "".join(f"line number {i} of the code\n" for i in range(3, 25)) + "```\n")


def _long_history(n: int) -> list[MessageRecord]:
    return [MessageRecord("user", f"question {i}") if i % 2 == 0 else
            MessageRecord("assistant", f"answer {i}. " + PARAGRAPH) for i in range(n)]


async def _filled_pane(app, pilot, n: int):
    """The app's one pane, once the engine is ready, given `n` messages of long history."""
    await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
    [pane] = app.workspace.grid.panes
    for m in _long_history(n):
        await pane.add_message(m)
    await settle(pilot)
    return pane


def _shown(transcript: Transcript) -> list[str]:
    return [v.message.content for v in transcript.views()]


def test_the_budget_counts_back_from_the_end_and_keeps_at_least_the_minimum():
    msgs = [MessageRecord("user", "x" * 920) for _ in range(10)]  # 1,000 characters each with the header
    assert shown_from(msgs, 10, 3_000) == 7
    assert shown_from(msgs, 10, 10) == 10 - MIN_SHOWN  # however small the budget
    assert shown_from(msgs, 5, 3_000, at_least=1) == 2  # counted back from `end`
    inherited = [MessageRecord("user", "y" * 5_000, inherited=True)] + msgs[:2]
    assert shown_from(inherited, 3, 3_000) == 0  # inherited context is never shown: it costs nothing


async def test_a_long_conversation_shows_its_latest_messages_and_page_up_at_the_top_brings_the_rest(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test() as pilot:
        pane = await _filled_pane(app, pilot, 40)
        history = _long_history(40)
        transcript = pane.query_one(Transcript)
        shown = _shown(transcript)
        assert MIN_SHOWN <= len(shown) < 20  # the latest ones, in order, and far from all
        assert shown == [m.content for m in history[-len(shown):]]
        assert sum(len(c) for c in shown) <= 2 * transcript.budget() + len(PARAGRAPH)
        note = transcript.query_one(".earlier-note")
        assert note.display and f"{40 - len(shown)} earlier messages" in str(note.render())
        # Page Up scrolls first; at the top it brings the stretch before, until all are shown.
        pane.focus_composer()
        for _ in range(200):
            if not transcript.hidden:
                break
            await pilot.press("pageup")
            await pilot.pause()
        assert _shown(transcript) == [m.content for m in history]
        assert not transcript.query_one(".earlier-note").display


async def test_new_messages_trim_the_oldest_views_only_while_the_reader_is_at_the_end(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        [pane] = app.workspace.grid.panes
        transcript = pane.query_one(Transcript)
        counts = []
        for m in _long_history(60):
            await pane.add_message(m)
            await pilot.pause()
            counts.append(len(transcript.views()))
        assert max(counts) < 30  # bounded while messages keep coming
        transcript.scroll_home(animate=False)  # a reader goes back up ...
        await pilot.pause()
        before = _shown(transcript)
        for m in _long_history(10):
            await pane.add_message(m)
        await pilot.pause()
        assert _shown(transcript)[:len(before)] == before  # ... and nothing is taken from under them
        transcript.scroll_end(animate=False)
        await pilot.pause()
        await pane.add_message(MessageRecord("user", "back at the end"))
        await pilot.pause()
        assert len(transcript.views()) < len(before) + 10  # at the end the oldest go again
        assert len(pane.record.messages) == 71  # the messages themselves are all kept


async def test_a_resumed_long_session_mounts_only_its_latest_messages(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test() as pilot:
        await _filled_pane(app, pilot, 40)
    again = make_app(tmp_path, ScriptedClient(), resume=True)
    async with again.run_test() as pilot:
        await wait_for(pilot, lambda: again.workspace.engine_ready, what="the engine")
        [pane] = again.workspace.grid.panes
        assert len(pane.record.messages) == 40
        transcript = pane.query_one(Transcript)
        assert MIN_SHOWN <= len(transcript.views()) < 20
        assert len(list(pane.query(MessageView))) == len(transcript.views())
        assert transcript.hidden == 40 - len(transcript.views())


async def test_editing_the_last_prompt_of_a_long_conversation_keeps_the_transcript_filled(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test() as pilot:
        pane = await _filled_pane(app, pilot, 30)
        transcript = pane.query_one(Transcript)
        # Take the last four messages away (as a resend of an earlier prompt does).
        await pane.truncate(pane.record.messages[-4], keep=False)
        await pilot.pause()
        shown = _shown(transcript)
        assert len(shown) >= MIN_SHOWN
        assert shown == [m.content for m in pane.record.messages[-len(shown):]]
        assert transcript.hidden == len(pane.record.messages) - len(shown)


def _at_end(transcript: Transcript) -> bool:
    return transcript.scroll_y >= transcript.max_scroll_y - 1


async def test_taking_messages_away_refills_without_moving_a_reader_at_the_end(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test() as pilot:
        pane = await _filled_pane(app, pilot, 40)
        transcript = pane.query_one(Transcript)
        transcript.scroll_end(animate=False)
        await pilot.pause()
        await pane.truncate(pane.record.messages[-4], keep=False)  # leaves less than the budget
        await pilot.pause()
        await pilot.pause()
        assert _at_end(transcript), (transcript.scroll_y, transcript.max_scroll_y)
        for m in _long_history(20):  # the conversation goes on below: still followed, still trimmed
            await pane.add_message(m)
            await pilot.pause()
        assert _at_end(transcript), (transcript.scroll_y, transcript.max_scroll_y)
        assert len(transcript.views()) < 20


async def test_context_notes_go_with_the_turns_they_follow(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test() as pilot:
        pane = await _filled_pane(app, pilot, 10)
        transcript = pane.query_one(Transcript)
        pane.focus_composer()
        for k in range(3):  # three turns that each push the oldest out of the context
            client.drop_next = 4
            await one_turn(pilot, client, f"q{k}")
        assert len(transcript.query(".context-note")) == 3
        for m in _long_history(30):
            await pane.add_message(m)
            await pilot.pause()
        # The turns they told of are no longer shown, and neither are they (not piled at the top).
        assert not transcript.query(".context-note")
        for _ in range(200):  # shown again, the history comes back above anything still shown
            if not transcript.hidden:
                break
            await transcript.show_earlier()
        kinds = [type(w).__name__ for w in transcript.children if w.display]
        assert kinds[0] == "MessageView" or transcript.children[0].has_class("fork-note")
        assert [v.message.content for v in transcript.views()][:4] == [m.content for m in pane.record.messages[:4]]


async def test_a_pane_that_grows_fills_its_larger_budget_from_the_earlier_messages(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=(70, 24)) as pilot:
        pane = await _filled_pane(app, pilot, 40)
        transcript = pane.query_one(Transcript)
        small = len(transcript.views())
        await pilot.resize_terminal(200, 60)  # as a zoom or a maximised terminal does
        await settle(pilot)
        await pilot.pause()
        assert len(transcript.views()) > small
        shown = sum(len(v.message.content) for v in transcript.views())
        assert shown >= transcript.budget() - 1_000 or not transcript.hidden
        assert _at_end(transcript)  # the reader at the end stays there
