"""Retry keeps the earlier answer (issue 26): page between a reply's answers, ‹k/n›, kept in the
database, the shown one sent on (scripted engine)."""

from __future__ import annotations

from itertools import count

from magnitude_tui.export import pane_markdown
from magnitude_tui.widgets.message_view import MessageView
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, settle, wait_for


def _numbered_replies():
    n = count(1)
    return lambda request: f"answer {next(n)}"


def _header(pane) -> str:
    [view] = [v for v in pane.query(MessageView) if v.message.role == "assistant"]
    return str(view.query_one(".header").content)


async def test_retry_keeps_the_earlier_answer_and_alt_arrows_page_between_them(tmp_path):
    client = ScriptedClient(reply=_numbered_replies())
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        await one_turn(pilot, client, "name a colour")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the retry")
        client.run_to_completion()
        await settle(pilot)
        reply = pane.last_reply()
        assert (reply.content, reply.answers) == ("answer 2", ["answer 1", "answer 2"])
        assert "‹2/2›" in _header(pane)
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: "‹1/2›" in _header(pane), what="the earlier answer")
        assert pane.last_reply().content == "answer 1"
        [body] = [v for v in pane.query(MessageView) if v.message is reply][0].query("Markdown")
        assert "answer 1" in body.source
        # The shown answer is the one the next turn sends.
        await one_turn(pilot, client, "why")
        assert [m.content for m in client.submitted[2].messages] == ["name a colour", "answer 1", "why"]
        assert "answer 2" in pane_markdown(pane)  # the export keeps both
        app.workspace.save()
    again = make_app(tmp_path, ScriptedClient(), resume=True)
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: again.workspace.grid.panes, what="the resumed pane")
        first = again.workspace.grid.panes[0].record.messages[1]
        assert (first.content, first.answers) == ("answer 1", ["answer 1", "answer 2"])


async def test_a_retry_stopped_before_its_first_token_gives_the_answer_back(tmp_path):
    client = ScriptedClient(reply=_numbered_replies())
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        await one_turn(pilot, client, "name a colour")
        await pilot.press("ctrl+g")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the retry")
        await pilot.press("escape")
        client.run_to_completion()
        await settle(pilot)
        assert [(m.role, m.content) for m in pane.record.messages] == [("user", "name a colour"),
                                                                       ("assistant", "answer 1")]
        assert pane.composer.value == ""  # the prompt stays in the conversation
