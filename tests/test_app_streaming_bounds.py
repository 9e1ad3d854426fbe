"""What a streaming reply holds stays bounded however long it grows: a screenful of its latest
finished blocks as Markdown widgets (older ones folded into text), and row counts rather than
rendered rows for its text."""

from __future__ import annotations

import gc
from functools import lru_cache
from itertools import accumulate

from textual.strip import Strip
from textual.widgets import Markdown

from magnitude_tui.widgets.message_view import MAX_MARKDOWN_CHARS, MIN_MARKDOWN_CHARS, MessageView, block_ends
from magnitude_tui.widgets.streaming_text import StreamingText, wrapped_rows
from tests.app_support import SIZE, ScriptedClient, make_app, settle, wait_for

PARAGRAPHS = 130


def _many_paragraphs(request) -> str:
    return "".join(f"Paragraph {i} says **one** thing in `ten` words or so.\n\n" for i in range(PARAGRAPHS))


def _reading_order(view: MessageView) -> str:
    """The body's text as drawn top to bottom: folded head, Markdown pieces, the open block."""
    parts = []
    for child in view.children:
        if isinstance(child, StreamingText):
            parts.append(child.text)
        elif isinstance(child, Markdown):
            parts.append(child.source)
    return "".join(parts)


async def test_a_long_streaming_reply_keeps_only_its_latest_blocks_as_markdown_widgets(tmp_path):
    client = ScriptedClient(reply=_many_paragraphs)
    app = make_app(tmp_path, client)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(*"go", "enter")
        pane = app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: pane.busy, what="the request")
        reply = _many_paragraphs(None).rstrip()  # as the scripted engine sends it
        widgets, folded = [], False
        while pane.busy:
            client.step(15)
            await settle(pilot)
            view = pane.query(MessageView).last()
            if view.message.role != "assistant" or view.settled:
                continue
            budget = view.markdown_budget()  # about what the transcript shows at once
            assert MIN_MARKDOWN_CHARS <= budget <= MAX_MARKDOWN_CHARS
            assert len(reply) > 3 * budget
            markdown = sum(len(piece.source) for piece in view.query_children(Markdown))
            assert markdown <= budget, "the Markdown pieces grew past their budget"
            assert _reading_order(view) == view.message.content, "folding lost or reordered text"
            folded = folded or bool(view.query_children(".folded"))
            widgets.append(sum(1 for _ in view.walk_children()))
        await settle(pilot)
        view = pane.query(MessageView).last()
        assert folded and view.settled and view.message.content == reply
        (document,) = view.query(Markdown)  # one document of the whole reply once it ended
        assert not view.query(StreamingText) and document.source == reply
        final = sum(1 for _ in view.walk_children())
        # While streaming, the widgets were bounded by the budget, not by the reply (which ends
        # as one document of a widget per paragraph).
        assert max(widgets) < final / 2, (max(widgets), final)


def test_block_ends_lists_every_finished_block():
    text = "a\n\n```py\nx\n\ny\n```\nb\n\nopen"
    assert block_ends(text) == [3, len("a\n\n```py\nx\n\ny\n```\n"), len("a\n\n```py\nx\n\ny\n```\nb\n\n")]


async def test_row_counts_agree_with_the_rows_drawn(tmp_path):
    # Rows are counted without drawing them; a count that disagreed with the drawing would cut
    # rows off or leave gaps.
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        view = StreamingText()
        await app.workspace.grid.panes[0].query_one(".transcript").mount(view)
        await pilot.pause()
        for line in ("", "x" * 25, "word " * 9, "**bold** and `code` **open", "日本語のテキストです",
                     "\tindented\tagain", "```py", "a  b   c    d"):
            for code in (False, True):
                for width in (1, 3, 7, 12, 40):
                    assert len(view._wrap(line, width, code)) == wrapped_rows(line, width, code), (line, width)


def _strips_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Strip)


async def _text_in_a_transcript(app, pilot):
    """A StreamingText mounted in the first pane's transcript: (transcript, view)."""
    transcript = app.workspace.grid.panes[0].query_one(".transcript")
    view = StreamingText()
    await transcript.mount(view)
    await pilot.pause()
    return transcript, view


async def test_streaming_text_keeps_row_counts_not_the_rows_of_a_long_text(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        transcript, view = await _text_in_a_transcript(app, pilot)
        before = _strips_alive()
        lines = [f"line {i} " + "**word** " * (i % 17) for i in range(20_000)]
        for start in range(0, len(lines), 2000):  # appended in paints, scrolled to the end each time
            view.append("".join(line + "\n" for line in lines[start:start + 2000]))
            transcript.scroll_end(animate=False)
            await pilot.pause()
        width = view.size.width
        rows = sum(wrapped_rows(line, width) for line in lines)
        await wait_for(pilot, lambda: view.size.height == rows, what="the layout of every row")
        transcript.scroll_home(animate=False)
        await pilot.pause()
        transcript.scroll_end(animate=False)
        await pilot.pause()
        # Every row was drawn at least once; what stays is the strips of recently drawn lines.
        assert _strips_alive() - before < 6000, "the widget keeps rows in proportion to its text"
        last = rows - wrapped_rows(lines[-1], width)  # the first row of the last line
        assert view.render_line(last).text.strip().startswith("line 19999 word")
        assert view.render_line(rows - 1).text.rstrip().endswith("word")
        assert view.render_line(0).text.strip() == "line 0"
        # A resize counts the rows again for the new width; the text is unchanged.
        await pilot.resize_terminal(60, SIZE[1])
        await wait_for(pilot, lambda: view.size.width != width, what="the new width")
        narrow = sum(wrapped_rows(line, view.size.width) for line in lines)
        await wait_for(pilot, lambda: view.size.height == narrow, what="the rows at the new width")
        assert narrow > rows


async def test_a_resize_counts_the_rows_on_screen_at_once_and_the_rest_on_later_ticks(tmp_path, monkeypatch):
    # A resize used to wrap every line of the text in the frame that showed the new size (the
    # UI endurance run: a 500,000-character reply, 50 resizes); now it wraps the lines at the end
    # (what an anchored transcript shows), estimates the rest and counts it exactly afterwards.
    import magnitude_tui.widgets.streaming_text as streaming_text

    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE) as pilot:
        transcript, view = await _text_in_a_transcript(app, pilot)
        lines = [f"line {i} " + "**word** " * (i % 17) for i in range(20_000)]
        view.append("".join(line + "\n" for line in lines))
        transcript.scroll_end(animate=False)
        rows_at = lru_cache(lambda width: sum(wrapped_rows(line, width) for line in lines))
        await wait_for(pilot, lambda: view.size.height == rows_at(view.size.width), what="every line counted")
        width = view.size.width

        calls: list[tuple] = []

        def counted(*args):
            calls.append(args)
            return wrapped_rows(*args)

        monkeypatch.setattr(streaming_text, "wrapped_rows", counted)
        monkeypatch.setattr(streaming_text, "REFINE_TICK_S", 3600.0)  # hold the later counting back
        await pilot.resize_terminal(60, SIZE[1])
        await wait_for(pilot, lambda: view.size.width != width, what="the new width")
        transcript.scroll_end(animate=False)
        await pilot.pause()
        narrow = view.size.width
        exact = [wrapped_rows(line, narrow) for line in lines]
        assert 0 < len(calls) < 1000, f"the resize wrapped {len(calls)} lines, not a screenful"
        # The end (what the anchored transcript shows) is drawn exactly already.
        drawn = [view.render_line(view.size.height - exact[-1] + k).text.strip() for k in range(exact[-1])]
        assert drawn == [strip.text.strip() for strip in view._wrap(lines[-1], narrow)]

        calls.clear()
        monkeypatch.setattr(streaming_text, "REFINE_TICK_S", 0.01)
        view._refine()  # the held tick, now
        narrow_rows = sum(exact)
        await wait_for(pilot, lambda: view.size.height == narrow_rows, what="the exact rows at the new width")
        assert len(calls) <= len(lines), "a line was wrapped more than once at one width"
        starts = [0, *accumulate(exact)]
        for k in (0, 1, 777, 5_000, 12_345, 19_999):
            assert view.render_line(starts[k]).text.strip().startswith(f"line {k} ") or \
                view.render_line(starts[k]).text.strip() == f"line {k}", k
        assert view.render_line(starts[-1] - 1).text.rstrip().endswith("word")
