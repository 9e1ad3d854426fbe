"""`--resume` on the real engine (worker in process, fake backend): the resumed conversation's
next reply starts from the KV saved when the app quit."""

from __future__ import annotations

from backend.factory import BackendConfig
from magnitude_tui.app import MagnitudeApp
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig, RestoreOutcome
from magnitude_tui.store import Store
from scheduler.types import SamplingParams
from tests.app_support import SIZE, ScriptedClient, make_app, wait_for

QUESTION = "Tell me a long story about the lighthouse keeper and the storm"


def _app(tmp_path, *, resume: bool, warm: bool = True) -> MagnitudeApp:
    config = EngineConfig(BackendConfig("fake", n_ctx=8192, n_seq_max=4), policy="fixed:64",
                          warm_dir=str(tmp_path / "kv") if warm else None)
    return MagnitudeApp(client=WorkerClient(config, in_process=True), store=Store(tmp_path / "magnitude.db"),
                        resume=resume, export_dir=tmp_path, sampling=SamplingParams(max_tokens=30))


async def _first_session(tmp_path) -> None:
    app = _app(tmp_path, resume=False)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")
        app.focused.insert(QUESTION)
        await pilot.press("enter")
        [pane] = app.workspace.grid.panes
        await wait_for(pilot, lambda: pane.replies.last_update is not None and not pane.busy, what="the reply")
    # Quitting stopped the engine, which saved the idle conversation.


async def test_resume_restores_the_saved_kv_and_the_next_reply_starts_from_it(tmp_path):
    await _first_session(tmp_path)
    assert list((tmp_path / "kv").glob("*.kv")), "nothing saved when the app quit"

    app = _app(tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        [pane] = ws.grid.panes
        await wait_for(pilot, lambda: pane.session_id in ws.model.warm, what="the engine's answer")
        answer = ws.model.warm[pane.session_id]
        assert answer.outcome is RestoreOutcome.RESTORED and answer.tokens > len(QUESTION)
        await pilot.press(*"and then?", "enter")
        await wait_for(pilot, lambda: not pane.busy and pane.replies.last_update.generated, what="the next reply")
        u = pane.replies.last_update
        assert u.cached_tokens == answer.tokens  # the whole history came from disk
        # Only the new turn was prefilled: its text and the template around it (one token a character).
        assert u.prompt_total - u.cached_tokens < len("and then?") + 30 < answer.tokens


async def test_without_saved_kv_the_resumed_conversation_starts_cold(tmp_path):
    await _first_session(tmp_path)
    for path in (tmp_path / "kv").glob("*.kv"):
        path.unlink()
    app = _app(tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        [pane] = ws.grid.panes
        await wait_for(pilot, lambda: pane.session_id in ws.model.warm, what="the engine's answer")
        assert ws.model.warm[pane.session_id].outcome is RestoreOutcome.NOT_SAVED
        await pilot.press(*"and then?", "enter")
        await wait_for(pilot, lambda: not pane.busy and pane.replies.last_update.generated, what="the next reply")
        assert pane.replies.last_update.cached_tokens == 0


async def test_resume_and_restart_ask_for_each_conversation_that_has_messages(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"hello", "enter")
        client.run_to_completion()
        [pane] = app.workspace.grid.panes
        await wait_for(pilot, lambda: not pane.busy and pane.record.messages[-1].complete, what="the reply")
        assert client.restored == []  # a new workspace: nothing to bring back
    client = ScriptedClient()
    app = make_app(tmp_path, client, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        [pane] = app.workspace.grid.panes
        assert client.restored == [(pane.session_id, pane.conversation())]
        await pilot.press("ctrl+n")  # an empty pane has nothing saved
        client.die()
        await wait_for(pilot, lambda: not app.workspace.engine_ready, what="the engine's death")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: len(client.restored) == 2, what="the restart's restore")
        assert client.restored[1] == client.restored[0]


async def test_deleting_a_conversation_deletes_its_saved_kv(tmp_path):
    await _first_session(tmp_path)
    assert list((tmp_path / "kv").glob("*.kv"))
    app = _app(tmp_path, resume=True)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        [pane] = ws.grid.panes
        await ws.conversations.delete(pane.session_id)
        await pilot.pause()
    assert not list((tmp_path / "kv").glob("*.kv"))
