"""`magnitude-tui --serve PORT`: HTTP conversations share the TUI's engine and show up as panes."""

from __future__ import annotations

import httpx
from textual.widgets import DataTable

from backend.factory import BackendConfig
from backend.fake import DEFAULT_REPLY
from magnitude_tui.app import MagnitudeApp
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.server import EmbeddedServer
from magnitude_tui.store import Store
from magnitude_tui.widgets.pane_grid import MAX_PANES
from magnitude_tui.widgets.status_line import StatusLine
from scheduler.types import Phase, SamplingParams
from tests.app_support import PACED, SIZE, wait_for
from tests.serve_support import free_port


def _app(tmp_path, backend: str = "fake"):
    config = EngineConfig(BackendConfig(backend, n_ctx=65536, n_seq_max=16, realtime=backend != "fake"),
                          policy="fixed:64")
    client = WorkerClient(config, in_process=True)
    port = free_port()
    serve = EmbeddedServer(client, host="127.0.0.1", port=port, options=ServeOptions(model_name="fake"))
    app = MagnitudeApp(client=client, store=Store(tmp_path / "m.db"), export_dir=tmp_path,
                       sampling=SamplingParams(max_tokens=30), serve=serve)
    return app, f"http://127.0.0.1:{port}/v1"


async def test_an_http_conversation_is_a_pane_and_its_next_turn_continues_there(tmp_path):
    app, base = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            body = {"messages": [{"role": "user", "content": "hello from an agent"}], "max_tokens": 12,
                    "user": "coder"}
            r = await http.post("/chat/completions", json=body)
            assert r.status_code == 200
            reply = r.json()["choices"][0]["message"]["content"]
            assert reply == DEFAULT_REPLY[:12]
            panes = app.workspace.grid.panes
            api = [p for p in panes if p.record.role == "api"]
            assert len(api) == 1 and api[0].record.name == "coder"
            await wait_for(pilot, lambda: api[0].replies.last_update is not None
                           and api[0].replies.last_update.phase is Phase.DONE, what="the pane's reply")
            assert [m.content for m in api[0].record.messages] == ["hello from an agent", reply]
            body["messages"] += [{"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
            r = await http.post("/chat/completions", json=body)
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            assert len([p for p in app.workspace.grid.panes if p.record.role == "api"]) == 1
            await wait_for(pilot, lambda: len(api[0].record.messages) == 4, what="the second turn")
            assert api[0].record.messages[2].content == "more"


async def test_closing_the_pane_cancels_the_http_request(tmp_path):
    app, base = _app(tmp_path, PACED)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            async with http.stream("POST", "/chat/completions", json={
                    "messages": [{"role": "user", "content": "a long job"}], "max_tokens": 60000,
                    "stream": True, "user": "worker"}) as r:
                lines = r.aiter_lines()
                await lines.__anext__()
                api = next(p for p in app.workspace.grid.panes if p.record.role == "api")
                await wait_for(pilot, lambda: api.is_mounted, what="the pane")
                app.workspace.grid.focus_pane(api)
                await pilot.press("ctrl+x", "y")  # it is replying: confirmed in the dialog
                rest = [line async for line in lines]
        errors = [line for line in rest if '"error"' in line]
        assert errors and "cancelled" in errors[0]
        assert rest[-1] == "data: [DONE]" or rest[-2] == "data: [DONE]"


async def test_eight_http_requests_complete_while_a_pane_streams(tmp_path):
    import asyncio

    app, base = _app(tmp_path, PACED)  # on the bare fake the person's reply once ended at 'length' first
    app.sampling = SamplingParams(max_tokens=60_000)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        await pilot.press(*"write", "enter")
        person = app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: person.replies.last_update is not None
                       and person.replies.last_update.generated > 0,
                       what="the pane streaming")
        panel = app.workspace.sequences_panel
        panel.clock = lambda: 0.0  # finished rows stay listed until the classes are read
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            replies = await asyncio.gather(*(http.post("/chat/completions", json={
                "messages": [{"role": "user", "content": f"agent {i}"}], "max_tokens": 20, "user": f"a{i}"})
                for i in range(8)))
        assert [r.status_code for r in replies] == [200] * 8
        assert all(r.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY[:20] for r in replies)
        assert person.busy  # the person's reply is still streaming beside them
        # The sequences panel shows each sequence's class: the person's turn, the API agents.
        await pilot.press("f2")
        api = [p for p in app.workspace.grid.panes if p.record.role == "api"]
        await wait_for(pilot, lambda: all(p.session_id in panel._rows for p in api), what="the agents' rows")
        panel.refresh_rows()
        table = panel.query_one(DataTable)
        assert table.get_cell(person.session_id, "class") == "you"
        assert {table.get_cell(p.session_id, "class") for p in api} == {"agent"} and len(api) == 8
        await pilot.press("escape")
        await wait_for(pilot, lambda: not person.busy, what="the pane's reply to stop")
        assert person.record.messages[-1].done_reason == "cancelled"


async def test_a_caller_without_a_user_is_titled_by_its_address_and_n_choices_by_their_caller(tmp_path):
    app, base = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        history = [{"role": "system", "content": "You are a careful agent. " * 6},
                   {"role": "user", "content": "first"}]
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            first = (await http.post("/chat/completions", json={"messages": history, "max_tokens": 8})).json()
            history += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "second"}]
            second = (await http.post("/chat/completions", json={"messages": history, "max_tokens": 8})).json()
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= first["usage"]["prompt_tokens"]
            api = [p for p in app.workspace.grid.panes if p.record.role == "api"]
            assert [p.record.name for p in api] == ["api@127.0.0.1"]
            # The pane says how much of the prompt came from the cache, as the reply's usage does.
            await wait_for(pilot, lambda: api[0].replies.last_update is not None
                           and api[0].replies.last_update.phase is Phase.DONE
                           and api[0].replies.last_update.cached_tokens == cached, what="the second turn's last update")
            shown = StatusLine.metrics_text(api[0].replies.last_update)
            assert f"({cached} cached)" in shown
            assert all(figure in shown for figure in ("TTFT ", " tok/s", "ITL p95 ")), shown
            r = await http.post("/chat/completions", json={
                "messages": [{"role": "user", "content": "three ways " * 10}], "max_tokens": 4, "n": 3,
                "user": "forker"})
            assert len(r.json()["choices"]) == 3
        names = sorted(p.record.name for p in app.workspace.grid.panes if p.record.role == "api")
        assert names == ["api@127.0.0.1", "forker", "forker#2", "forker#3"]


async def test_conversations_beyond_a_full_grid_are_listed_in_the_sequences_panel(tmp_path):
    import asyncio

    app, base = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        panel = app.workspace.sequences_panel
        panel.clock = lambda: 0.0  # finished rows stay listed until they are read
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            replies = await asyncio.gather(*(http.post("/chat/completions", json={
                "messages": [{"role": "user", "content": f"caller {i}"}], "max_tokens": 10, "user": f"u{i}"})
                for i in range(17)))
        assert [r.status_code for r in replies] == [200] * 17
        panes = app.workspace.grid.panes
        assert len(panes) == MAX_PANES and len([p for p in panes if p.record.role == "api"]) == MAX_PANES - 1
        await wait_for(pilot, lambda: {r.name for r in panel._rows.values()} >= {f"u{i}" for i in range(17)},
                       what="a row for every caller")
        unpaned = [r for r in panel._rows.values() if r.name not in {p.record.name for p in panes}]
        assert len(unpaned) == 2 and all(r.update.phase is Phase.DONE for r in unpaned)


def test_a_conversation_without_a_pane_leaves_the_panel_when_the_worker_dies():
    # Beyond a full grid a conversation has only its sequences-panel row, and nothing to close: the
    # row must end with its request. A dead worker's last word for each live request comes as a
    # bare SeqUpdate, not in a StepReport, and was skipped: the row stayed live for good.
    from types import SimpleNamespace

    from magnitude_tui.engine.events import SeqUpdate, StepReport
    from magnitude_tui.serve.panes import ApiPanes
    from scheduler.types import DoneReason, Message, Request

    shown: list[tuple[str, str, Phase]] = []
    workspace = SimpleNamespace(
        panes_by_session=lambda: {f"s{i}": None for i in range(MAX_PANES)},
        sequences_panel=SimpleNamespace(apply=lambda u, name, t: shown.append((u.session_id, name, u.phase))))
    panes = ApiPanes(SimpleNamespace(on_request=None), workspace)
    for i in (1, 2):
        panes.on_request(Request(f"r{i}", f"extra{i}", (Message("user", "hi"),), SamplingParams()), f"u{i}")
    running = StepReport(step=1, t=1.0, step_ms=10.0, decode_rows=2, prefill_rows=0, budget=64, kv_used=2,
                         kv_total=4096, waiting=0, running=2, policy="fixed:64", updates=[
        SeqUpdate("r1", "extra1", 0, Phase.GENERATING), SeqUpdate("r2", "extra2", 1, Phase.GENERATING)])
    panes.show_unpaned([running])
    panes.show_unpaned([SeqUpdate(f"r{i}", f"extra{i}", None, Phase.DONE, done_reason=DoneReason.ERROR,
                                  error="the engine worker died") for i in (1, 2)])
    assert shown == [("extra1", "u1", Phase.GENERATING), ("extra2", "u2", Phase.GENERATING),
                     ("extra1", "u1", Phase.DONE), ("extra2", "u2", Phase.DONE)]
    assert not panes._unpaned
