"""`--serve`: an API caller's tool calls and results show in its pane as tool blocks (the call's
name and arguments, the result's size; the time is the caller's, not shown), not as an empty
assistant message and a `tool` note holding the raw result; the pane's store keeps them."""

from __future__ import annotations

import httpx

from magnitude_tui.store import Store
from magnitude_tui.widgets.message_view import MessageView
from magnitude_tui.widgets.tool_block import ToolBlock
from scheduler.types import Phase
from tests.app_support import SIZE, wait_for
from tests.test_serve_tui import _app


async def test_an_api_callers_tool_turns_show_as_blocks_in_its_pane(tmp_path):
    app, base = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        call = {"id": "call_7", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
        body = {"user": "sdk", "max_tokens": 8, "messages": [
            {"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_7", "content": "rain, 4 degrees"}]}
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            r = await http.post("/chat/completions", json=body)
        assert r.status_code == 200
        [pane] = [p for p in app.workspace.grid.panes if p.record.role == "api"]
        await wait_for(pilot, lambda: pane.replies.last_update is not None
                       and pane.replies.last_update.phase is Phase.DONE,
                       what="the pane's reply")
        await wait_for(pilot, lambda: len(pane.query(ToolBlock)) == 1 and not pane.busy, what="the block")
        await pilot.pause(0.2)
        [block] = pane.query(ToolBlock)
        assert block.summary() == '✓ get_weather({"city": "Oslo"}) · 15 chars'
        # Nothing else shows the call or the raw result: no empty reply, no `tool` note.
        shown = [v for v in pane.query(MessageView) if v.display]
        assert [v.message.role for v in shown] == ["user", "tool", "assistant"]
        roles = [(m.role, [c.name for c in m.tool_calls], m.call and m.call.name) for m in pane.record.messages]
        assert roles == [("user", [], None), ("assistant", ["get_weather"], None), ("tool", [], "get_weather"),
                         ("assistant", [], None)]
    store = Store(tmp_path / "m.db")
    [record] = [p for p in store.open_workspace(resume=True) if p.role == "api"]
    assert record.messages[2].call.arguments == '{"city": "Oslo"}' and record.messages[2].duration_s is None
    store.close()
