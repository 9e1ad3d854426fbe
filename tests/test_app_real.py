"""End to end on the real model: the app, its engine worker process, llama.cpp on CPU."""

from __future__ import annotations

import pytest

from tests.app_support import SIZE, make_app, wait_for
from tests.needs import need_real_model

need_real_model()

from backend.factory import BackendConfig  # noqa: E402
from magnitude_tui.engine.client import WorkerClient  # noqa: E402
from magnitude_tui.engine.events import EngineConfig  # noqa: E402
from scheduler.types import Phase, SamplingParams  # noqa: E402

ORDER = [Phase.PREPARING, Phase.QUEUED, Phase.PREFILL, Phase.GENERATING, Phase.DONE]


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_two_panes_stream_then_subagents_report_back_on_the_real_model(tmp_path):
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=4096))
    app = make_app(tmp_path, WorkerClient(config), sampling=SamplingParams(max_tokens=24))
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        seen: dict[str, list[Phase]] = {}
        route = ws.link.route

        def spy(update, t=None):
            phases = seen.setdefault(update.session_id, [])
            if not phases or phases[-1] is not update.phase:
                phases.append(update.phase)
            route(update, t)

        ws.link.route = spy
        await wait_for(pilot, lambda: ws.engine_ready, timeout=240, what="the model to load")
        await pilot.press(*"What is 2+2?", "enter")
        await pilot.press("ctrl+n")
        await pilot.press(*"Name a color.", "enter")
        await wait_for(pilot, lambda: len(ws.grid.panes) == 2 and all(p.record.messages for p in ws.grid.panes),
                       what="both prompts submitted")
        a1, a2 = ws.grid.panes
        await wait_for(pilot, lambda: not a1.busy and not a2.busy, timeout=240, what="both replies")
        for pane in (a1, a2):
            reply = pane.record.messages[-1]
            assert reply.role == "assistant" and reply.content.strip() and reply.complete
            phases = seen[pane.session_id]
            assert phases == sorted(phases, key=ORDER.index), phases  # only ever forward
            assert phases[0] is Phase.PREPARING  # the engine reports every request preparing first
            # A short prompt is prefilled in the step that samples its first token, so its next
            # update already says generating (a long one shows prefill in between: engine tests).
            assert {Phase.GENERATING, Phase.DONE} <= set(phases)
            assert pane.replies.last_update.ttft_ms and pane.replies.last_update.generated > 0

        ws.grid.focus_pane(a1)
        await pilot.press(*"/spawn 2 say one word", "enter")
        await wait_for(pilot, lambda: len([m for m in a1.record.messages if m.author]) == 2, timeout=240,
                       what="two subagent answers")
        for child in ws.grid.panes[2:]:
            assert child.replies.last_update.cached_tokens > 0  # forked from A1's KV, not prefilled again
        names = [(p.record.name, len(p.record.messages)) for p in ws.grid.panes]
    assert [n for n, _ in names] == ["A1", "A2", "A1.1", "A1.2"]

    resumed = make_app(tmp_path, resume=True)
    async with resumed.run_test(size=SIZE) as pilot:
        restored = lambda: [(p.record.name, len(p.record.messages)) for p in resumed.workspace.grid.panes]  # noqa: E731
        await wait_for(pilot, lambda: restored() == names, what=f"{names} restored")


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_an_agent_in_a_pane_calls_a_tool_on_the_real_model(tmp_path):
    # A role whose first turn must call its one tool (the grammar makes it a list_dir call), run
    # by /agent in a pane on the real engine: the tool block shows the call, and the next turn
    # starts from the KV of the first (its prompt's head comes from the cache).
    from magnitude_tui.agents import RoleBook
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.store import Store
    from magnitude_tui.widgets.tool_block import ToolBlock

    work = tmp_path / "work"
    work.mkdir()
    (work / "README.md").write_text("# demo\n")
    agents = tmp_path / "agents.toml"
    agents.write_text('[lister]\nsystem = "You list files."\ntools = ["list_dir"]\ntool_choice = "required"\n'
                      'approve = "read-only"\nmax_tokens = 48\n')
    config = EngineConfig(BackendConfig("llama", device="cpu", n_ctx=4096))
    app = MagnitudeApp(client=WorkerClient(config), store=Store(tmp_path / "magnitude.db"),
                       export_dir=tmp_path / "exports", roles=RoleBook(agents), workdir=work)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        turns: dict[str, tuple[int, int, int]] = {}  # request id -> (prompt, cached, generated), in order
        route = ws.link.route

        def spy(update, t=None):
            if update.prompt_total:
                turns[update.request_id] = (update.prompt_total, update.cached_tokens, update.generated)
            route(update, t)

        ws.link.route = spy
        await wait_for(pilot, lambda: ws.engine_ready, timeout=240, what="the model to load")
        await pilot.press(*"/agent lister Which files are here?", "enter")
        pane = ws.grid.panes[0]
        await wait_for(pilot, lambda: len(pane.query(ToolBlock)) > 0, timeout=240,
                       what="the first tool call to finish")
        block = pane.query(ToolBlock).first()
        assert block.tool == "list_dir"
        await wait_for(pilot, lambda: len(turns) >= 2 and list(turns.values())[1][2] > 0, timeout=240,
                       what="the turn after the tool")
        (first, _, _), (second, cached, _) = list(turns.values())[:2]
        assert second > first and cached >= first, turns
        ws.agents.stop(pane)
        await wait_for(pilot, lambda: not ws.agents.running(pane), timeout=60, what="the agent to stop")
