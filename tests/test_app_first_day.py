"""Pilot tests for a newcomer's first day (issue 26): keys after ctrl+n, --resume after an empty
launch, f4 reopening a workspace, and role mistakes (scripted engine)."""

from __future__ import annotations

from textual import events

from magnitude_tui.agents import AgentSettings, RoleBook
from magnitude_tui.commands import UnknownRole, parse_slash
from magnitude_tui.screens.conversation_list import ConversationList
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, settle, type_message, wait_for

CRITIC = AgentSettings("critic", "You find the weakest point.", 0.2, 50)


def _burst(app, keys: list[str]) -> None:
    """Keys as a terminal delivers a fast burst (tmux send-keys): all queued before the app
    handles the first, which pilot.press never does."""
    for key in keys:
        app._driver.send_message(events.Key(key, key if len(key) == 1 else None))


async def test_keys_typed_right_after_ctrl_n_belong_to_the_new_pane(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "first")
        await pilot.press(*"half")  # typed in A1, not sent
        _burst(app, ["ctrl+n", *"QQ", "enter", *"next"])
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the message typed after ctrl+n")
        a1, a2 = app.workspace.grid.panes
        assert client.submitted[1].session_id == a2.session_id
        assert [m.content for m in client.submitted[1].messages] == ["QQ"]
        assert a1.composer.value == "half" and a2.composer.value == "next"
        assert app.workspace.grid.focused_pane() is a2
        client.run_to_completion()
        await settle(pilot)
        app.workspace.save()
        # The database agrees: nothing of it went to A1's conversation.
        assert [m.content for m in app.store.messages(a1.session_id) if m.role == "user"] == ["first"]
        assert [m.content for m in app.store.messages(a2.session_id) if m.role == "user"] == ["QQ"]


async def _session(tmp_path, *turns: str, resume: bool = False) -> list[str]:
    """One launch: a turn in each of the panes `turns` names (a new pane for each after the
    first), then quit; returns the pane names open at the end."""
    client = ScriptedClient()
    app = make_app(tmp_path, client, resume=resume)
    async with app.run_test(size=SIZE) as pilot:
        for i, text in enumerate(turns):
            if i:
                await pilot.press("ctrl+n")
            await one_turn(pilot, client, text)
        names = [p.record.name for p in app.workspace.grid.panes]
    app.store.close()
    return names


async def test_resume_skips_a_launch_that_was_quit_untouched(tmp_path):
    assert await _session(tmp_path, "plan a trip", "pack a bag") == ["A1", "A2"]
    assert await _session(tmp_path) == ["A1"]  # a plain launch, quit at once
    client = ScriptedClient()
    app = make_app(tmp_path, client, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 2, what="the session before it")
        a1, a2 = app.workspace.grid.panes
        assert [m.content for m in a1.record.messages][:1] == ["plan a trip"]
        assert [m.content for m in a2.record.messages][:1] == ["pack a bag"]


async def test_f4_reopens_a_whole_earlier_workspace(tmp_path):
    await _session(tmp_path, "plan a trip", "pack a bag")
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        grid = app.workspace.grid
        [empty] = grid.panes
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        await pilot.press(*"pack")  # search: A2 of the earlier workspace
        await wait_for(pilot, lambda: [r.name for r in app.screen.rows] == ["A2"], what="the search")
        assert "w1" in app.screen.query_one("#list-rows").get_option_at_index(0).prompt
        await pilot.press("f3")
        await wait_for(pilot, lambda: [p.record.name for p in grid.panes] == ["A1", "A2"],
                       what="both panes of the earlier workspace")
        # The untouched pane of this launch gave way (and its name) to them.
        assert empty not in grid.panes
        assert [m.content for m in grid.panes[0].record.messages][:1] == ["plan a trip"]
        assert grid.focused_pane() is grid.panes[0]
        assert {r.name for r in app.store.conversations()} == {"A1", "A2"}


def test_a_word_before_the_count_that_is_no_role_is_refused():
    for text in ("/spawn critc 2 say hi", "/spawn critc say hi"):
        try:
            parse_slash(text, ["critic", "scribe"])
        except UnknownRole as exc:
            assert exc.name == "critc" and "did you mean critic?" in str(exc)
            assert "known roles: critic, scribe" in str(exc)
        else:
            raise AssertionError(f"{text} was accepted")
    assert parse_slash("/spawn 2 say hi", ["critic"]).arg == "say hi"
    assert parse_slash("/spawn list three risks", ["critic"]).arg == "list three risks"


async def test_spawn_with_an_unknown_role_names_the_known_ones_and_spawns_nothing(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client, roles={"critic": CRITIC})
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "plan a trip")
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/spawn critc 2 say hi")
        await wait_for(pilot, lambda: any("unknown role 'critc'" in n.message for n in app._notifications),
                       what="the refusal")
        [note] = [n.message for n in app._notifications if "unknown role" in n.message]
        assert "known roles: critic" in note and "did you mean critic?" in note
        assert len(app.workspace.grid.panes) == 1 and len(client.submitted) == 1
        assert pane.composer.value == "/spawn critc 2 say hi"  # back, to fix and send again


async def test_agents_toml_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text('[critic]\nsystem = "You find the weakest point."\n')
    book = RoleBook(path)
    assert list(book.roles) == ["critic"]
    client = ScriptedClient()
    app = make_app(tmp_path, client, roles=book)
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "plan a trip")
        path.write_text('[critic]\nsystem = "x"\n[scout]\nsystem = "You look ahead."\ntemperature = 0.1\n')
        await type_message(pilot, "/spawn scout 1 look ahead")
        await wait_for(pilot, lambda: len(client.submitted) == 2, what="the scout")
        request = client.submitted[1]
        assert request.messages[0].content == "You look ahead." and request.sampling.temperature == 0.1
        # A file that turns bad keeps the roles it had, and the workspace says why.
        path.write_text("[scout]\ntemperature = 'hot'\n")
        app.workspace.check_roles()
        assert "temperature must be a number" in book.problem and "scout" in book.roles
        await wait_for(pilot, lambda: any("temperature must be a number" in n.message for n in app._notifications),
                       what="the file's problem shown")


async def test_a_conversation_is_titled_by_its_first_message_and_f4_finds_words_deep_inside(tmp_path):
    client = ScriptedClient(reply=lambda request: "Pack light.\n\nTake the night train to Kyoto, then walk.")
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        assert pane.border_title == "A1 · main"
        await one_turn(pilot, client, "Plan a four-day trip through Japan in spring, cheaply please")
        assert pane.border_title == "A1 · main · Plan a four-day trip through Japan in…"
        app.workspace.save()
        [row] = app.store.conversations("night train")
        assert row.preview.startswith("Plan a four-day trip") and "night train to Kyoto" in row.match
        await pilot.press("f4")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationList), what="the list")
        await pilot.press(*"night train")
        await wait_for(pilot, lambda: "night train to Kyoto" in str(
            app.screen.query_one("#list-rows").get_option_at_index(0).prompt), what="the hit shown")


async def test_keys_typed_right_after_ctrl_x_never_reach_the_closed_conversation(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await one_turn(pilot, client, "first")
        await pilot.press("ctrl+n")
        a1, a2 = app.workspace.grid.panes
        _burst(app, ["ctrl+x", *"hi", "enter"])
        await wait_for(pilot, lambda: app.workspace.grid.panes == [a1] and len(client.submitted) == 2,
                       what="A2 closed and the message sent")
        # The keys after ctrl+x belong to the pane on screen once it is gone: A1.
        assert client.submitted[1].session_id == a1.session_id
        client.run_to_completion()
        await settle(pilot)
        app.workspace.save()
        assert app.store.messages(a2.session_id) == []


async def test_a_message_from_a_pane_closed_meanwhile_is_not_sent(tmp_path):
    from magnitude_tui.widgets.chat_pane import ChatPane

    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+n")
        a1, a2 = app.workspace.grid.panes
        await app.workspace.close_pane(a2)
        app.workspace.post_message(ChatPane.Submitted(a2, "late"))
        await wait_for(pilot, lambda: a1.composer.value == "late", what="the text back, unsent")
        assert client.submitted == [] and app.store.messages(a2.session_id) == []
