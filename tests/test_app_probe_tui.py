"""Probing the TUI as a keyboard-first user (scripted engine): what users type reaches titles,
lists, tables and toasts as text, never as markup."""

from __future__ import annotations

from textual.widgets import DataTable, Label, OptionList

from magnitude_tui.widgets.sequences_panel import SequencesPanel
from tests.app_support import SIZE, ScriptedClient, make_app, settle, type_message, wait_for

MARKUP = "[/red] a closing tag [b]"


async def test_text_that_looks_like_markup_is_shown_as_written_in_titles_lists_and_dialogs(tmp_path):
    """A first message "[/red] ..." ended the app (MarkupError: the pane's border title read it
    as markup); a name "[b]x" would have drawn x in bold, the brackets gone."""
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        [pane] = app.workspace.grid.panes
        await type_message(pilot, MARKUP)
        client.run_to_completion()
        await settle(pilot)
        assert MARKUP in str(pane._border_title)
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.screen.query(OptionList), what="the conversation list")
        row = app.screen.query_one(OptionList).get_option_at_index(0)
        assert MARKUP in str(row.prompt)
        await pilot.press("f2")  # rename it to markup too
        await pilot.press("ctrl+u", *"[b]x", "enter")
        await wait_for(pilot, lambda: pane.record.name == "[b]x", what="the rename")
        assert str(pane._border_title).startswith("[b]x · main")
        await pilot.press("f2")  # the sequences panel names the pane
        panel = app.workspace.query_one(SequencesPanel)
        await type_message(pilot, "again")
        client.step(3)
        await settle(pilot)
        panel.refresh_rows()
        cell = panel.query_one(DataTable).get_row_at(0)[0]
        assert str(cell) == "[b]x"
        client.run_to_completion()
        await settle(pilot)
        for key, title in (("ctrl+s", "#spawn-title"), ("f6", "#agent-title")):
            await pilot.press(key)
            await wait_for(pilot, lambda: app.screen.query(title), what=key)
            assert "[b]x" in str(app.screen.query_one(title, Label).render())
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.workspace, what="the dialog closed")


async def test_toasts_show_what_the_user_typed_as_text(tmp_path):
    """A pane renamed "[/x] oops" ended the app as ctrl+x's toast ("Closed [/x] oops · ...") came
    up: a toast reads its text as markup when drawn. So did a policy typed "[/x]" in ctrl+l's
    dialog ("Not a policy: unknown scheduling policy '[/x]' ...")."""
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        [pane] = app.workspace.grid.panes
        app.workspace.model.conversations.rename(pane.session_id, "[/x] oops")
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: pane not in app.workspace.grid.panes, what="the close")
        await pilot.press("ctrl+l", "tab", *"[/y]", "enter")
        await pilot.pause(0.3)  # the toasts are drawn
        shown = app.export_screenshot()
        assert "Closed [/x] oops" in shown.replace("&#160;", " ")
        assert "policy &#x27;[/y]&#x27;" in shown.replace("&#160;", " ")
        assert app.is_running


ESCAPES = "start \x1b[2J\x1b[H\x1b[41mREDBG\x1b[0m mid \x1b]0;PWNED\x07 end \x9b2J"


def _drawn(app) -> str:
    return app.export_screenshot().replace("&#160;", " ")


async def test_escape_sequences_in_replies_and_pastes_are_shown_not_sent_to_the_terminal(tmp_path):
    """A reply holding ESC [2J ESC [H cleared the terminal and ESC ]0;PWNED BEL retitled its
    window (seen in tmux): control characters reached the terminal as they were, in the streaming
    text, the finished Markdown, a pasted message and the pane's title. They are drawn as their
    pictures (ESC as ␛), and a paste loses its colour sequences."""
    client = ScriptedClient(reply=lambda request: ESCAPES)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        [pane] = app.workspace.grid.panes
        await pilot.press("g", "o", "enter")
        client.step(6)  # streaming: the open block is StreamingText
        await settle(pilot)
        assert "\x1b" not in _drawn(app) and "␛[2J␛[H␛[41mREDBG" in _drawn(app)
        client.run_to_completion()  # finished: one Markdown document
        await settle(pilot)
        drawn = _drawn(app)
        assert "\x1b" not in drawn and "\x9b" not in drawn and "\x07" not in drawn
        assert "␛]0;PWNED␇ end" in drawn
        assert pane.record.messages[-1].content == ESCAPES  # the text itself is kept as it came
        from textual import events

        pane.composer.post_message(events.Paste("line \x1b[1;31mred\x1b[0m\r\nnext \x00 ok\x1b[A"))
        await pilot.pause()
        assert pane.composer.text == "line red\nnext ␀ ok"
        await pilot.press("enter")
        client.run_to_completion()
        await settle(pilot)
        assert "\x1b" not in _drawn(app) and "next ␀ ok" in _drawn(app)
        app.workspace.model.conversations.rename(pane.session_id, "A\x1b[2J")
        assert "\x1b" not in _drawn(app) and "A␛[2J · main" in str(pane._border_title)


async def test_an_export_closes_a_code_block_a_reply_left_open(tmp_path):
    """A reply cut off inside a code block (its token limit) left the fence open in f5's export:
    every heading and message after it read as that block's code."""
    from markdown_it import MarkdownIt

    replies = iter(["Here:\n```python\nprint(1)", "~~~\nstill open", "fine"])
    client = ScriptedClient(reply=lambda request: next(replies))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        for text in ("code please", "more", "thanks"):
            await type_message(pilot, text)
            client.run_to_completion()
            await settle(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: list((tmp_path / "exports").glob("*.md")), what="the export")
    [path] = (tmp_path / "exports").glob("*.md")
    tokens = MarkdownIt().parse(path.read_text(encoding="utf-8"))
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[1:] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert [t.content for t in tokens if t.type == "fence"] == ["print(1)\n", "still open\n"]


async def test_reopening_the_last_closed_pane_takes_back_its_name_from_the_empty_one(tmp_path):
    """ctrl+x on the only pane opens an empty A1 in its place; reopening the closed A1 from f4 then
    renamed it "A1 (2)" for good (in the store) beside that empty pane. The empty pane gives way,
    as it does when f4 reopens a whole workspace; a pane the user opened and kept is left alone."""
    from magnitude_tui.screens.conversation_list import ConversationList
    from magnitude_tui.store import Store

    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        grid = app.workspace.grid
        [first] = grid.panes
        await type_message(pilot, "keep this conversation")
        client.run_to_completion()
        await settle(pilot)
        await pilot.press("ctrl+x")
        await wait_for(pilot, lambda: grid.panes and grid.panes[0] is not first, what="the empty pane")
        [empty] = grid.panes
        assert empty.record.name == "A1"
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        await pilot.press(*"keep", "enter")
        await wait_for(pilot, lambda: [p.session_id for p in grid.panes] == [first.session_id], what="the reopen")
        [reopened] = grid.panes
        assert reopened.record.name == "A1" and grid.focused_pane() is reopened
        store = Store(tmp_path / "magnitude.db")
        assert [r.name for r in store.conversations()] == ["A1"]  # the empty pane is not listed


async def test_page_keys_page_through_a_long_conversation_list(tmp_path):
    """f4 with sixty conversations: pagedown and pageup did nothing (the search box has the focus
    and the list took no paging keys), so a row far down took a press of down per row."""
    from textual.widgets import OptionList

    from magnitude_tui.screens.conversation_list import ConversationList
    from magnitude_tui.store import MessageRecord, PaneRecord

    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        store = app.workspace.model.store
        for k in range(60):
            store.add_pane(PaneRecord(f"p{k:04d}", f"B{k}", messages=[MessageRecord("user", f"topic {k}")]))
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        options = app.screen.query_one(OptionList)
        page = options.scrollable_content_region.height - 1
        await pilot.press("pagedown")
        assert options.highlighted == page
        await pilot.press(*["pagedown"] * 5)
        assert options.highlighted == 60  # the last row (61 with this launch's pane), no wrap
        await pilot.press("pageup")
        assert options.highlighted == 60 - page
        await pilot.press(*["pageup"] * 5)
        assert options.highlighted == 0


async def test_dialogs_fit_a_small_terminal_and_scroll_to_what_has_the_focus(tmp_path):
    """On an 80x24 terminal f4's list (96 columns) lost its right border and the end of its help
    line ("esc close"), and f6's agent dialog its Cancel and Save buttons below the screen; below 72
    columns (a split tmux pane) every dialog was cut. Each fits the screen now, and one taller than
    the screen scrolls to the widget that has the focus."""
    from textual.containers import Vertical

    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=(60, 20)) as pilot:
        await type_message(pilot, "hello")
        client.run_to_completion()
        await settle(pilot)
        for key in ("f4", "f6", "ctrl+s", "ctrl+l"):
            await pilot.press(key)
            await wait_for(pilot, lambda: app.screen is not app.workspace, what=key)
            await pilot.pause()
            box = app.screen.query_one(Vertical)
            assert app.screen.region.contains_region(box.region), (key, box.region)
            if key == "f6":
                save = app.screen.query_one("#agent-save")
                save.focus()
                await wait_for(pilot, lambda: box.region.contains_region(save.region), what="Save in view")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.workspace, what="the dialog closed")


async def test_a_slash_command_that_fails_goes_back_to_the_composer(tmp_path):
    """A message that only begins with a slash ("/usr/bin/python crashes ...") or a mistyped command
    ("/sapwn 3 <a long task>") was refused with a toast and the text was gone: the composer had
    cleared on Enter. It comes back to be fixed, and a leading space sends it as a message."""
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        [pane] = app.workspace.grid.panes
        for text in ("/usr/bin/python crashes on import", "/spawn 99 review the whole plan", "/burst x"):
            await type_message(pilot, text)
            assert pane.composer.text == text
            assert "back in the composer" in list(app._notifications)[-1].message
            pane.composer.value = ""
        await type_message(pilot, " /usr/bin/python crashes on import")
        await wait_for(pilot, lambda: len(client.submitted) == 1, what="the message sent")
        assert pane.record.messages[0].content == " /usr/bin/python crashes on import"


async def test_a_rename_reaches_the_headers_and_the_subagents_that_name_the_pane(tmp_path):
    """f4's rename of A1 to "research" left its replies headed "A1" (new ones said "research") and
    its subagent titled "A1.1 ← A1" with its task "task from A1", until the next launch."""
    from magnitude_tui.widgets.message_view import MessageView

    def headers(pane) -> list[str]:
        return [str(v.query_one(".header").render()) for v in pane.query(MessageView)]

    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        await type_message(pilot, "plan")
        client.run_to_completion()
        await settle(pilot)
        await type_message(pilot, "/spawn 1 check it")
        client.run_to_completion()
        await settle(pilot)
        parent, child = ws.grid.panes
        ws.model.conversations.rename(parent.session_id, "research")
        await pilot.pause()
        assert headers(parent)[:2] == ["you", "research"]
        assert str(child._border_title).startswith("A1.1 ← research")
        assert headers(child) == ["task from research", "A1.1"]
