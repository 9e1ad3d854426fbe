"""Snapshot tests of the main layouts at a fixed terminal size, on the scripted engine."""

from __future__ import annotations

from textual.widgets import Input, TextArea

from magnitude_tui.agents import AgentSettings
from tests.app_support import SIZE, ScriptedClient, make_app, quiet, type_message, wait_for


def _reply_with_code(request) -> str:
    return ("Here is a **plan**:\n\n1. measure\n2. schedule\n\n```python\nstep_ms = fixed + "
            "per_row * rows\n```\nDone.")


def _freeze_clock(pilot) -> None:
    """Finished rows leave the sequences panel after seconds of wall clock; a slow machine must not
    change what the snapshot shows, so the panel's clock stands still."""
    pilot.app.workspace.sequences_panel.clock = lambda: 0.0


async def _settle(pilot) -> None:
    """Wait until every engine batch is applied and painted (by condition: a slow machine takes
    longer), stop cursor blink, hide transcript scrollbars (their thumb repaints a frame late, at
    random), then wait until three screenshots 0.3 s apart agree (paint tick 0.1 s, panels 0.25 s)."""
    await wait_for(pilot, lambda: quiet(pilot.app), what="every engine batch applied and painted")
    for screen in pilot.app.screen_stack:
        for widget in [*screen.query(Input), *screen.query(TextArea)]:
            widget.cursor_blink = False
        for transcript in screen.query(".transcript"):
            transcript.styles.scrollbar_size_vertical = 0
    previous, agreed = None, 0
    for _ in range(30):
        await pilot.pause(0.3)
        current = pilot.app.export_screenshot()
        agreed = agreed + 1 if current == previous else 0
        if agreed == 2:  # three alike in a row: no panel timer was merely late
            return
        previous = current
    # A snapshot taken now would compare a screen still changing: fail here, with the reason,
    # rather than as a random diff (or, worse, a match by luck).
    raise AssertionError("the screen never settled: no three screenshots 0.3 s apart agreed in 9 s")


def test_loading_view(snap_compare, tmp_path):
    app = make_app(tmp_path, ScriptedClient(auto_ready=False))
    assert snap_compare(app, terminal_size=SIZE, run_before=_settle)


def test_single_pane_with_markdown_reply(snap_compare, tmp_path):
    client = ScriptedClient(reply=_reply_with_code)
    app = make_app(tmp_path, client)

    async def run_before(pilot):
        await type_message(pilot, "how do we budget a step")
        client.run_to_completion()
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_four_panes_streaming_with_sequences_panel(snap_compare, tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)

    async def run_before(pilot):
        _freeze_clock(pilot)
        for i, text in enumerate(("alpha", "bravo", "charlie", "delta")):
            if i:
                await pilot.press("ctrl+n")
            await type_message(pilot, text)
            client.step(1)  # staggered arrivals: each pane is at a different phase
        client.step(3)
        await pilot.press("f2")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_burst_spawn_with_sequences_panel(snap_compare, tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)

    async def run_before(pilot):
        _freeze_clock(pilot)
        await type_message(pilot, "brainstorm")
        client.run_to_completion()
        parent = pilot.app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: not parent.busy, what="the parent's reply")  # forks include it
        await pilot.press("ctrl+b", "f2")
        # Wait for the burst itself (8 subagent submits), not a fixed time: under load mounting
        # eight panes can take longer than any pause chosen here.
        await wait_for(pilot, lambda: len(client.submitted) >= 9, what="the burst's 8 submits")
        client.step(3)
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_light_theme_zoomed(snap_compare, tmp_path):
    client = ScriptedClient(reply=_reply_with_code)
    app = make_app(tmp_path, client, theme="magnitude-paper")

    async def run_before(pilot):
        await type_message(pilot, "plan")
        client.run_to_completion()
        await pilot.press("ctrl+n", "shift+tab", "ctrl+o")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_spawn_dialog(snap_compare, tmp_path):
    app = make_app(tmp_path, theme="magnitude-phosphor")

    async def run_before(pilot):
        await pilot.press("ctrl+s")
        await pilot.press(*"find the bug")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_policy_dialog(snap_compare, tmp_path):
    app = make_app(tmp_path)

    async def run_before(pilot):
        await pilot.press("ctrl+l")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_context_gauge_and_dropped_turns(snap_compare, tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)

    async def run_before(pilot):
        for text in ("one", "two", "three"):
            await type_message(pilot, text)
            client.run_to_completion()
            await wait_for(pilot, lambda: quiet(pilot.app), what="the reply")
        client.drop_next = 2
        await type_message(pilot, "four")
        client.run_to_completion()
        await type_message(pilot, "five")  # queued behind nothing: sent at once, then shown streaming
        client.step(3)
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_conversation_list(snap_compare, tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)

    async def run_before(pilot):
        pilot.app.store._db.execute("UPDATE panes SET created = 0")  # ages shown as dates, not minutes
        for i, text in enumerate(("plan the trip", "pack the bags")):
            if i:
                await pilot.press("ctrl+n")
            await type_message(pilot, text)
            client.run_to_completion()
            await wait_for(pilot, lambda: quiet(pilot.app), what="the reply")
        pilot.app.workspace.save()
        pilot.app.store._db.execute("UPDATE messages SET created = 86400 * 365 * 30 + id")
        await pilot.press("ctrl+x", "f4")
        pilot.app.clear_notifications()  # the "Closed A2" toast times out: not part of the shot
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_agent_dialog(snap_compare, tmp_path):
    roles = {"critic": AgentSettings("critic", "You find the weakest point of a plan.", 0.2, 200)}
    app = make_app(tmp_path, roles=roles)

    async def run_before(pilot):
        await pilot.press("f6", *"critic")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_approval_dialog(snap_compare, tmp_path):
    from magnitude_tui.agent.policy import ApprovalRequest, ToolKind
    from magnitude_tui.screens.approval_dialog import ApprovalDialog

    diff = "--- a/notes.txt\n+++ b/notes.txt\n@@ -1,2 +1,2 @@\n-hello\n+goodbye\n world"
    request = ApprovalRequest("A1/2", "A1", "edit_file",
                              '{"path": "notes.txt", "old_text": "hello", "new_text": "goodbye"}',
                              ToolKind.WRITE, diff)
    app = make_app(tmp_path)

    async def run_before(pilot):
        await wait_for(pilot, lambda: quiet(pilot.app), what="the workspace")
        pilot.app.push_screen(ApprovalDialog(request))
        await pilot.press("n", *"not that file")
        await _settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
