"""Scenario 15, short: one pane receives a long reply fast while seven others stream and the
terminal is resized; the app keeps answering keys and what it holds does not grow with the reply."""

from __future__ import annotations

from magnitude_bench.ui_endurance import rss_mb
from magnitude_tui.widgets.composer import Composer
from magnitude_tui.widgets.message_view import LONG_REPLY_CHARS, MessageView
from magnitude_tui.widgets.streaming_text import StreamingText
from tests.app_support import ScriptedClient, make_app, settle, wait_for

PANES = 8
BLOCK = "lorem-ipsum-" * 20 + "\n\n"  # one finished Markdown block per token (a "word" has no space)
FLOOD_TOKENS = 4 * LONG_REPLY_CHARS // len(BLOCK)
SIZES = ((160, 50), (120, 40), (200, 60), (100, 34))


def _reply(request) -> str:
    if request.session_id == FLOODED["session"]:
        return " ".join(BLOCK for _ in range(FLOOD_TOKENS))
    return " ".join(f"word{i}" for i in range(FLOOD_TOKENS + 10))


FLOODED: dict[str, str] = {}


def _descendants(view: MessageView) -> int:
    return sum(1 for _ in view.walk_children())


async def test_a_flooded_pane_beside_seven_streaming_ones_keeps_the_app_answering_and_bounded(tmp_path):
    client = ScriptedClient(reply=_reply)
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZES[0]) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        for _ in range(PANES - 1):
            await pilot.press("ctrl+n")
        panes = app.workspace.grid.panes
        assert len(panes) == PANES
        FLOODED["session"] = panes[0].record.id
        for pane in panes:
            pane.query_one(Composer).focus()
            await pilot.press(*"go", "enter")
        await wait_for(pilot, lambda: all(p.busy for p in panes), what="every pane to send")
        typing = panes[1].query_one(Composer)
        typing.focus()
        rss0, counts, typed = rss_mb(), [], ""
        for i in range(FLOOD_TOKENS // 24):
            client.step(24)
            await pilot.resize_terminal(*SIZES[i % len(SIZES)])
            await pilot.press(str(i % 10))
            typed += str(i % 10)
            await wait_for(pilot, lambda: typing.value == typed, what="the typed key to reach the composer")
            await settle(pilot)
            flooded = panes[0].query(MessageView).last()
            if len(flooded.message.content) > 2 * LONG_REPLY_CHARS:
                counts.append(_descendants(flooded))
        client.run_to_completion(max_steps=FLOOD_TOKENS + 20)
        await settle(pilot)
        flooded = panes[0].query(MessageView).last()
        assert flooded.settled and flooded.message.complete
        assert len(flooded.message.content) >= 4 * LONG_REPLY_CHARS - len(BLOCK)
        # Past LONG_REPLY_CHARS the reply is drawn by one StreamingText holding the rest of it:
        # the widgets do not grow with the reply, and it is not parsed again when it ends.
        assert counts and max(counts) == min(counts) == _descendants(flooded), counts
        tail = flooded.query(StreamingText).last()
        assert flooded.message.content.endswith(tail.text)
        assert all(p.query(MessageView).last().settled for p in panes)
        assert rss_mb() - rss0 < 150, "memory grew far beyond the text the replies hold"


def test_the_flood_follows_the_clock_when_steps_come_late():
    # The stand-in engine shares the app's process: on a busy machine its steps come late, and a
    # flood counted per step took many times its planned duration (the 100,000-token run was
    # stopped after 7 minutes). A late step hands over what the flood owes by then.
    from magnitude_bench.ui_endurance import FloodClient
    from scheduler.types import Phase, Request

    client = FloodClient(flood=2000, burst=40, step_hz=25.0, tokens=10**9)
    client.submit(Request("flood", "s0", ()))
    client.submit(Request("other", "s1", ()))
    for t in (0.0, 0.04):  # prefill, then the first tokens
        client._step(t)
    assert client.flood_sent == 40
    report = client._step(1.04)  # a second late: 25 steps' worth are owed
    flood = next(u for u in report.updates if u.request_id == "flood")
    assert client.flood_sent == flood.generated == 40 + 25 * 40
    other = next(u for u in report.updates if u.request_id == "other")
    assert other.new_tokens == 1  # the other panes stream at their own pace
    report = client._step(60.0)  # never more than the flood
    flood = next(u for u in report.updates if u.request_id == "flood")
    assert client.flood_sent == 2000 and flood.phase is Phase.DONE


def test_the_flood_never_sends_more_than_it_was_asked_for():
    # A flood that is not a whole number of bursts ends on a short step, not a whole burst past it
    # (the run's reported tokens are what was sent).
    from magnitude_bench.ui_endurance import FloodClient
    from scheduler.types import Phase, Request

    client = FloodClient(flood=50, burst=40, step_hz=25.0, tokens=10**9)
    client.submit(Request("flood", "s0", ()))
    client._step(0.0)  # prefill
    client._step(0.04)
    assert client.flood_sent == 40
    report = client._step(0.08)
    flood = next(u for u in report.updates if u.request_id == "flood")
    assert client.flood_sent == flood.generated == 50 and flood.phase is Phase.DONE
