"""Pilot tests for what the app says and how it draws it (issue 26, defect 9): the close dialog,
refusals, burst titles, API pane labels, line breaks in replies, exports, narrow status lines."""

from __future__ import annotations

import pytest
from textual.containers import Vertical

from magnitude_tui.app import MagnitudeApp
from magnitude_tui.export import default_export_dir, safe_name
from magnitude_tui.screens.confirm_dialog import ConfirmDialog
from magnitude_tui.store import MessageRecord, PaneRecord, Store, default_db_path
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.message_view import MessageView
from magnitude_tui.widgets.status_line import StatusLine, fit_parts
from scheduler.drafts import DraftKind
from scheduler.speculation import SpecMode, available_sources
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, settle, type_message, wait_for


def _notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def test_the_close_dialog_shows_its_whole_question(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=(80, 24)) as pilot:
        await type_message(pilot, "a long answer please")
        client.step(3)
        await settle(pilot)
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the dialog")
        await pilot.pause()
        box = app.screen.query_one(Vertical)
        detail = app.screen.query_one("#confirm-detail")
        # Wrapped inside the box, every line of it shown: nothing runs past the border.
        assert detail.region.right <= box.content_region.right
        assert detail.size.height >= 3
        assert box.region.bottom <= 24


def test_a_missing_draft_source_is_named_once():
    with pytest.raises(ValueError) as refused:
        available_sources(SpecMode.DRAFT, {})
    assert "needs a draft model, and none is loaded" in str(refused.value)
    assert "draft draft" not in str(refused.value)
    with pytest.raises(ValueError, match="needs n-gram lookup"):
        available_sources(SpecMode.NGRAM, {DraftKind.DRAFT_MODEL: object()})


async def test_a_burst_that_does_not_fit_titles_the_ones_that_do_and_says_so(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "plan a trip")
        for _ in range(12):
            await pilot.press("ctrl+n")
        app.workspace.grid.focus_pane(app.workspace.grid.panes[0])
        await type_message(pilot, "/burst 8")
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 16, what="the burst")
        children = app.workspace.grid.panes[13:]
        assert [c.record.task.split(":")[0] for c in children] == [f"Perspective {k} of 3" for k in (1, 2, 3)]
        assert any("Asked for 8 subagents; room for 3" in n for n in _notes(app))


async def test_api_panes_name_the_caller_and_the_model_apart(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        record = PaneRecord("apiconv", "api@127.0.0.1", "api", None, "api@127.0.0.1", 1,
                            [MessageRecord("user", "hi"), MessageRecord("assistant", "hello")])
        app.store.add_pane(record)
        pane = ChatPane(record)
        await app.workspace.add_pane(pane)
        await pilot.pause()
        speakers = [str(v.query_one(".header").content) for v in pane.query(MessageView)]
        assert speakers == ["caller api@127.0.0.1", "model"]


async def test_single_line_breaks_in_a_reply_are_kept(tmp_path):
    client = ScriptedClient(reply=lambda request: "Roses are red,\nviolets are blue.")
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "a poem")
        [reply] = [v for v in app.workspace.grid.panes[0].query(MessageView) if v.message.role == "assistant"]
        await wait_for(pilot, lambda: reply.settled, what="the reply's final body")
        await pilot.pause()
        [paragraph] = reply.query("MarkdownParagraph")
        assert paragraph.size.height == 2  # two lines, not "Roses are red, violets are blue."


async def test_an_export_goes_to_the_export_folder_with_a_safe_name_and_says_where(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await one_turn(pilot, client, "plan a trip")
        pane = app.workspace.grid.panes[0]
        app.workspace.conversations.rename(pane.session_id, "trip (v2) @home")
        await pilot.press("f5")
        await wait_for(pilot, lambda: list((tmp_path / "exports").glob("*.md")), what="the export")
        [path] = (tmp_path / "exports").glob("*.md")
        assert path.name.startswith("magnitude-trip-v2-home-") and " " not in path.name
        assert any(str(path.resolve()) in n for n in _notes(app))
    assert safe_name("A1 (2)") == "A1-2" and safe_name("api@127.0.0.1") == "api-127.0.0.1"
    assert safe_name("../..") == "pane"


def test_exports_default_to_the_data_directory(tmp_path):
    app = MagnitudeApp(client=ScriptedClient(), store=Store(tmp_path / "m.db"))
    assert app._export_dir == default_export_dir()
    assert default_export_dir().parent == default_db_path().parent


async def test_nine_panes_get_a_compact_status_line_with_whole_figures(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        for _ in range(8):
            await pilot.press("ctrl+n")
        for pane in ws.grid.panes:
            await ws.turns.send(pane, "count to ten slowly")
        client.step(3)
        await settle(pilot)
        assert len(ws.grid.panes) == 9
        for pane in ws.grid.panes:
            status = pane.query_one(StatusLine)
            metrics = status.query_one(".metrics")
            shown = str(metrics.render())
            assert status.has_class("-compact") and str(status.query_one(".badge").content) == "GEN"
            assert shown.startswith("20.0 tok/s") and len(shown) <= metrics.content_size.width
            assert "TTFT 80 ms" in str(metrics.content)  # all of them kept, shown as far as they fit
            # The border's context gauge drops its bar and keeps its figures whole.
            assert pane.border_subtitle.startswith("ctx ") and "▱" not in pane.border_subtitle
            assert len(pane.border_subtitle) <= pane.size.width - 6


async def test_two_panes_show_whole_figures_rate_first(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+n")
        for pane in app.workspace.grid.panes:
            await app.workspace.turns.send(pane, "count to ten slowly")
        client.step(3)
        await settle(pilot)
        for pane in app.workspace.grid.panes:
            metrics = pane.query_one(StatusLine).query_one(".metrics")
            shown = str(metrics.render())
            assert shown.startswith("20.0 tok/s · TTFT 80 ms") and len(shown) <= metrics.content_size.width


def test_fit_parts_keeps_whole_figures():
    assert fit_parts(["20.4 tok/s", "TTFT 80 ms"], 16) == "20.4 tok/s"
    assert fit_parts(["20.4 tok/s", "TTFT 80 ms"], 23) == "20.4 tok/s · TTFT 80 ms"
    assert fit_parts(["a long error message"], 5) == "a long error message"  # cut by the widget
