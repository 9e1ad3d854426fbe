"""f4 right after a message: the list read the store, which the save tick (every 0.5 s) had not
reached yet, so the conversation just typed into showed "0 msgs (no messages)". f4 now saves first."""

from __future__ import annotations

from textual.widgets import OptionList

from tests.app_support import SIZE, ScriptedClient, make_app, type_message, wait_for


async def test_the_list_shows_a_message_sent_just_before_it_opened(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        for timer in list(app.workspace._timers):  # no save tick at all: only f4's own save
            timer.stop()
        await type_message(pilot, "plan the trip")
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.screen.query(OptionList), what="the conversation list")
        row = str(app.screen.query_one(OptionList).get_option_at_index(0).prompt)
        assert "1 msg" in row and "plan the trip" in row, row
