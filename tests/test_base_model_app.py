"""The app with a model that has no chat template: the load notice, and a pane in raw-completion mode (/raw)."""

from __future__ import annotations

from backend.template_fallback import fallback_notice
from magnitude_tui.engine.events import EngineInfo, EngineReady, LoadProgress
from tests.app_support import SIZE, ScriptedClient, make_app, one_turn, settle, type_message, wait_for

NOTICE = fallback_notice(("<|im_end|>", "<|im_start|>"))


class _BaseModelClient(ScriptedClient):
    """A scripted engine whose model, like a base model, has no chat template."""

    def ready(self) -> None:
        self._ready = True
        self._emit([LoadProgress(1.0, "base.gguf", "CPU"),
                    EngineReady("base.gguf", "CPU", 8192, 16, 2048, self.policy,
                                info=EngineInfo(template_notice=NOTICE))])


async def test_the_missing_chat_template_is_told_at_load(tmp_path):
    app = make_app(tmp_path, _BaseModelClient())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        await wait_for(pilot, lambda: any(n.message == NOTICE for n in app._notifications), what="the notice")
        assert "no chat template" in NOTICE and "/raw" in NOTICE


async def test_a_model_with_a_template_gets_no_such_notice(tmp_path):
    app = make_app(tmp_path, ScriptedClient())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        await settle(pilot)
        assert not any("chat template" in n.message for n in app._notifications)


async def test_raw_mode_sends_the_transcript_text_as_the_prompt(tmp_path):
    client = _BaseModelClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
        [pane] = app.workspace.grid.panes
        await type_message(pilot, "/raw")
        assert pane.raw and "raw" in pane.border_title
        assert not client.submitted  # a mode switch sends nothing
        await one_turn(pilot, client, "Once upon a time")
        first = client.submitted[-1]
        assert first.prompt == "Once upon a time"
        reply = pane.last_answer()
        assert reply
        await one_turn(pilot, client, "The end.")
        # The transcript continued as text: prompt, the model's continuation, the next piece.
        assert client.submitted[-1].prompt == "Once upon a time" + reply + "The end."
        await type_message(pilot, "/raw")
        assert not pane.raw and "raw" not in pane.border_title
        await one_turn(pilot, client, "chat again")
        assert client.submitted[-1].prompt is None
        assert client.submitted[-1].messages[-1].content == "chat again"
