"""Streaming replies: Markdown block by block, the open block as cheap text; the paint schedule; the
model-free CPU harness (bench ui-cpu) comes back with well-formed figures."""

from __future__ import annotations

import time

import pytest
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownFence, MarkdownParagraph

from magnitude_bench.ui_cpu import CpuConfig, PacedClient, reply_tokens, run_cpu
from magnitude_tui.screens.painter import BACKGROUND_PAINT_S, BUSY_PANES, TYPING_MAX_HOLD_S, Painter
from magnitude_tui.widgets.message_view import MessageView, settled_prefix
from magnitude_tui.widgets.streaming_text import StreamingText
from tests.app_support import SIZE, ScriptedClient, make_app, settle, type_message, wait_for


def _code_reply(request) -> str:
    return "Use **this**:\n\n```python\nstep_ms = fixed + per_row * rows\n```\nThat is `all`."


def _sources(view: MessageView) -> list[str]:
    return [m.source for m in view.query(Markdown)]


def _reply_view(pane) -> MessageView:
    return [v for v in pane.query(MessageView) if v.message.role == "assistant"][-1]


async def test_reply_streams_as_markdown_block_by_block(tmp_path):
    client = ScriptedClient(reply=_code_reply)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await type_message(pilot, "how")
        pane = app.workspace.grid.panes[0]
        client.step(8)  # prefill, then tokens up to inside the code block
        reply = lambda: pane.replies.streaming  # noqa: E731
        painted_in = lambda: pane._views.get(reply())  # noqa: E731
        # Wait for the state itself (a piece's source is empty until it is mounted and parsed).
        await wait_for(pilot, lambda: reply() is not None and reply().message.content.endswith("per_row * ")
                       and painted_in() is not None and not reply().pending
                       and _sources(painted_in()) == ["Use **this**:\n\n"]
                       and painted_in().query(MarkdownParagraph)
                       and painted_in().query(StreamingText).first().text.endswith("per_row * "),
                       what="the paint tick to take every token")
        view = _reply_view(pane)
        markdown, body = view.query_one(Markdown), view.query_one(StreamingText)
        await wait_for(pilot, lambda: body.size.height > 0 and markdown.query_one(MarkdownParagraph).region.height,
                       what="the layout that places both")
        # The finished paragraph is Markdown already; the open code block is still streaming text.
        assert markdown.source == "Use **this**:\n\n"
        assert markdown.source + body.text == pane.record.messages[-1].content
        assert markdown.query_one(MarkdownParagraph).region.y < body.region.y  # in reading order
        assert body.text.startswith("```python\nstep_ms = fixed")
        assert not markdown.query(MarkdownFence)
        rows = [body.render_line(y).text.rstrip() for y in range(body.size.height)]
        assert rows[0] == "```python"
        client.step(1)  # "rows\n```\nThat ": the fence closes, so the code block becomes Markdown
        expected = ["Use **this**:\n\n", "```python\nstep_ms = fixed + per_row * rows\n```\n"]
        await wait_for(pilot, lambda: _sources(view) == expected and view.query(Markdown)[1].query(MarkdownFence),
                       what="the code block's piece, parsed")
        pieces = view.query(Markdown)
        fence = pieces[1].query_one(MarkdownFence)
        assert "per_row * rows" in fence.code and fence.lexer == "python"
        assert body.text == "That "
        client.run_to_completion()
        await wait_for(pilot, lambda: not pane.busy and _reply_view(pane).settled
                       and _reply_view(pane).query(MarkdownFence), what="the reply to end, parsed as one")
        view = _reply_view(pane)
        assert not view.query(StreamingText)
        (markdown,) = view.query(Markdown)
        assert markdown.source == _code_reply(None)  # parsed once more, as one document
        fence = markdown.query_one(MarkdownFence)
        assert "per_row * rows" in fence.code and fence.lexer == "python"


async def test_a_reply_view_that_never_got_mounted_takes_its_writes_and_end_quietly():
    # As the app closes, a paint can mount a reply's view onto a transcript being torn down
    # (Textual then skips the mount; seen in a CI rehearsal of `bench ui`): painting it must not
    # crash the app on its way out. The text is in the message record either way.
    from magnitude_tui.store import MessageRecord

    view = MessageView(MessageRecord("assistant", "Hello\n\nthere", complete=False), speaker="A1", streaming=True)
    await view.write("Hello\n\nthere")
    await view.finish()
    assert view.settled and not view.children


def test_settled_prefix_ends_at_finished_blocks():
    assert settled_prefix("Hello wor") == 0
    assert settled_prefix("Hello world.\n") == 0  # the paragraph may go on
    assert settled_prefix("Hello.\n\nNext") == len("Hello.\n\n")
    assert settled_prefix("```py\nx = 1\n\ny = 2\n") == 0  # a blank line inside a fence ends nothing
    assert settled_prefix("```py\nx = 1\n```\nafter") == len("```py\nx = 1\n```\n")
    assert settled_prefix("a\n\n```py\nx\n") == len("a\n\n")


async def test_streaming_text_relays_out_only_when_its_row_count_changes(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        view = StreamingText()
        await app.workspace.grid.panes[0].query_one(".transcript").mount(view)
        await pilot.pause()
        layouts = []
        original = view.refresh

        def refresh(*args, layout: bool = False, **kwargs):
            layouts.append(layout)
            return original(*args, layout=layout, **kwargs)

        view.refresh = refresh
        width = view.size.width
        view.append("a")
        view.append("b")  # same row
        view.append("x" * width)  # wraps onto a second row
        view.append("\n")
        view.append("`code` and **bold**")
        assert layouts == [True, False, True, False, True]  # first row, -, wrap, (tail empty), new line
        await wait_for(pilot, lambda: view.size.height == 3, what="the layout of three rows")
        assert view.render_line(2).text.rstrip() == "code and bold"


async def test_background_panes_paint_less_often_while_many_stream(tmp_path):
    client = ScriptedClient(reply=lambda r: " ".join(["word"] * 60))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        for i in range(BUSY_PANES + 1):
            if i:
                await pilot.press("ctrl+n")
            await type_message(pilot, f"q{i}")
        client.step(4)
        await settle(pilot)
        focused, other = ws.grid.focused_pane(), ws.grid.panes[0]
        assert focused is not other and focused.busy and other.busy
        focused.composer.typed_at = -1.0  # not typing (the prompts were typed just now)
        ws.painter.painted_all = time.monotonic() + 3600  # as if every pane was just painted: not due again
        client.step(2)
        await wait_for(pilot, lambda: other.replies.streaming.pending and focused.replies.last_update.generated >= 4,
                       what="two more tokens")
        await ws.paint()  # what the tick does: the focused pane is painted, the others wait
        assert not focused.replies.streaming.pending and other.replies.streaming.pending
        ws.painter.painted_all = 0.0
        await ws.paint()
        assert not other.replies.streaming.pending
        # Typing: the background panes' paint waits while keys come, up to TYPING_MAX_HOLD_S.
        client.step(2)
        await wait_for(pilot, lambda: other.replies.streaming.pending, what="two more tokens")
        focused.composer.typed_at = before = time.monotonic()  # the user is typing...
        ws.painter.painted_all = time.monotonic() - BACKGROUND_PAINT_S  # ...when the background is due
        await pilot.press("x")
        assert focused.composer.typed_at > before  # a key in the composer counts as typing
        await ws.paint()
        assert other.replies.streaming.pending
        ws.painter.painted_all = time.monotonic() - TYPING_MAX_HOLD_S  # held long enough...
        ws.painter.painted_at.clear()  # ...and no pane painted within it
        focused.composer.typed_at = time.monotonic()
        await ws.paint()
        assert other.replies.streaming.pending  # while keys come the tick paints nobody...
        for _ in ws.grid.panes:  # ...a pane is painted after each key's frame (see the next test)
            await ws.painter.after_key()
        assert not other.replies.streaming.pending


async def test_when_the_typing_hold_is_used_up_the_panes_are_painted_one_per_key_after_its_frame(tmp_path):
    # A frame that lays out every streaming pane took ~0.5 s of the app's thread with eight panes:
    # a key typed meanwhile waited for all of it. While keys come the tick paints nothing; once the
    # hold is used up, one pane is painted right after each key's frame (when the next key is a
    # typing interval away), so a key waits for no pane's frame at a typing pace.
    client = ScriptedClient(reply=lambda r: " ".join(["word"] * 60))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        for i in range(3):
            if i:
                await pilot.press("ctrl+n")
            await type_message(pilot, f"q{i}")
        client.step(4)
        await settle(pilot)
        panes, focused = ws.grid.panes, ws.grid.focused_pane()
        focused.composer.typed_at = time.monotonic() + 3600  # typing, for as long as the test needs
        ws.painter.painted_all = time.monotonic() + 3600  # the app's own painter holds throughout
        client.step(2)
        await wait_for(pilot, lambda: all(p.replies.streaming.pending for p in panes), what="two more tokens")
        painter = Painter(ws)  # driven by hand: its hold is used up, no pane painted within it
        painter.painted_all = time.monotonic() - TYPING_MAX_HOLD_S
        await painter.paint()
        assert all(p.replies.streaming.pending for p in panes)  # the tick paints nothing while keys come
        painted = []
        for _ in panes:
            await painter.after_key()
            now_painted = [p for p in panes if not p.replies.streaming.pending]
            assert len(now_painted) == len(painted) + 1  # exactly one more pane a key
            painted = now_painted
        client.step(2)
        await wait_for(pilot, lambda: all(p.replies.streaming.pending for p in panes), what="two more tokens")
        await painter.after_key()
        assert all(p.replies.streaming.pending for p in panes)  # each had its turn: the hold starts again


async def test_a_typed_key_tells_the_workspace_once_its_frame_is_drawn(tmp_path):
    # The painter's moment for a waiting pane is right after a key's frame: the composer posts
    # KeyShown after the refresh that follows the key.
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        shown = []
        original = ws.painter.after_key

        async def after_key():
            shown.append(ws.grid.focused_pane().composer.value)
            await original()

        ws.painter.after_key = after_key
        await pilot.press("h", "i")
        await wait_for(pilot, lambda: len(shown) == 2, what="two keys shown")
        assert shown[-1] == "hi"


async def test_while_keys_come_not_even_the_focused_panes_text_is_painted(tmp_path):
    # A new row of text lays out the whole screen: the frame that shows a typed key should draw
    # only the composer, so the focused pane's text waits too (at most TYPING_MAX_HOLD_S).
    client = ScriptedClient(reply=lambda r: " ".join(["word"] * 60))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        await type_message(pilot, "q")
        client.step(3)
        await settle(pilot)
        focused = ws.grid.focused_pane()
        focused.composer.typed_at = time.monotonic() + 3600  # typing, for as long as the test needs
        ws.painter.painted_all = time.monotonic() + 3600  # ...and the hold is not used up
        client.step(2)
        await wait_for(pilot, lambda: focused.replies.streaming.pending, what="two more tokens")
        await ws.paint()
        assert focused.replies.streaming.pending
        focused.composer.typed_at = -1.0  # the keys stopped
        await ws.paint()
        assert not focused.replies.streaming.pending


def test_paced_client_gives_every_live_request_one_token_per_step():
    from scheduler.types import Message, Phase, Request, SamplingParams

    client = PacedClient(tokens=3)
    for i in range(2):
        client.submit(Request(f"r{i}", f"s{i}", (Message("user", "hi"),), SamplingParams()))
    reports = [client._step(i * 0.04) for i in range(5)]
    assert [[u.phase for u in r.updates] for r in reports[:2]] == [[Phase.PREFILL] * 2, [Phase.GENERATING] * 2]
    assert [u.text_delta for u in reports[1].updates] == [reply_tokens()[0]] * 2
    assert [u.phase for u in reports[3].updates] == [Phase.DONE] * 2 and not reports[4].updates
    assert client.emitted == 6


@pytest.mark.timeout(60)
async def test_cpu_harness_reports_well_formed_figures():
    r = await run_cpu(CpuConfig(panes=2, duration_s=1.5, key_interval_s=0.15, size=(120, 40)))
    assert 1.4 <= r.wall_s < 10
    assert r.process_cpu_s > 0 and 0 < r.app_cores < 4 and r.engine_thread_cpu_s >= 0
    assert r.steps > 10 and r.tokens >= r.steps  # two panes generating every step
    assert r.frames > 0 and r.keys
    painted = [k for k in r.keys if k is not None]
    assert painted and r.key_p50_ms <= r.key_p95_ms <= r.key_max_ms < 2000
    assert "cores" in r.summary()


async def test_finished_blocks_wait_in_the_open_text_while_keys_come(tmp_path):
    # Mounting a finished block as Markdown lays out the screen several frames in a row; a key
    # typed meanwhile waited for them (bench ui-cpu, 8 panes: key p50 350-1,118 ms with it,
    # 10-20 ms without). So while keys come the blocks stay in the open text.
    app = make_app(tmp_path, client := ScriptedClient(reply=_code_reply))
    async with app.run_test(size=SIZE) as pilot:
        await type_message(pilot, "how")
        pane = app.workspace.grid.panes[0]
        assert app.screen.focused is pane.composer
        pane.composer.typed_at = float("inf")  # keys keep coming (a waiting pane is painted after a key)
        client.step(8)  # prefill, then tokens past the first paragraph, into the code block
        painter = app.workspace.painter
        painted_in = lambda: pane._views.get(pane.replies.streaming)  # noqa: E731
        for _ in range(300):
            painter.painted_all, painter.painted_at = 0.0, {}  # the hold is used up: the pane's turn
            await painter.after_key()  # what a key's frame being drawn does
            if (painted_in() is not None and not pane.replies.streaming.pending
                    and painted_in().query(StreamingText).last().text.endswith("per_row * ")):
                break
            await pilot.pause(0.1)
        else:
            raise AssertionError("no paint while keys come")
        await pilot.pause()
        view = painted_in()
        assert not view.query(Markdown)
        assert view.query(StreamingText).last().text == pane.record.messages[-1].content
        pane.composer.typed_at = -1.0  # the typing stops: the next paint settles what finished
        client.step(1)  # the fence closes as well
        expected = ["Use **this**:\n\n```python\nstep_ms = fixed + per_row * rows\n```\n"]
        await wait_for(pilot, lambda: _sources(view) == expected, what="the finished blocks as Markdown")
        assert view.query(StreamingText).last().text == "That "
