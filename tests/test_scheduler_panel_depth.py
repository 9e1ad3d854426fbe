"""The scheduler panel reports the attention path, the KV idle conversations hold, the CPU threads and the host-memory tier."""

from __future__ import annotations

from textual.app import App, ComposeResult

from magnitude_tui.engine.events import StepReport
from magnitude_tui.widgets.scheduler_panel import SchedulerPanel

# A plain 8-row decode step; each test adds the field it is about.
STEP = dict(step=1, t=0.0, step_ms=40.0, decode_rows=8, prefill_rows=0, budget=24, kv_used=30,
            kv_total=8192, waiting=0, running=8, policy="target:50")


class _PanelApp(App):
    def compose(self) -> ComposeResult:
        yield SchedulerPanel()


async def test_the_panel_shows_the_attention_choice_and_resident_idle_kv():
    app = _PanelApp()
    async with app.run_test(size=(60, 30)):
        panel = app.query_one(SchedulerPanel)
        panel.set_engine("SmolLM2.gguf", "CPU", "flash off · measured 1.90x")
        panel.record(StepReport(step=1, t=0.0, step_ms=40.0, decode_rows=8, prefill_rows=0, budget=24,
                                kv_used=3000, kv_total=8192, waiting=0, running=8, policy="target:50",
                                kv_idle=1200))
        text = panel.render().plain
        assert "attn    flash off · measured 1.90x" in text
        assert "3000/8192 cells · 1200 idle" in text
        panel.set_engine("fake", "fake")  # a backend that chose nothing says nothing
        assert "attn" not in panel.render().plain


async def test_the_panel_shows_the_engines_thread_count_and_why():
    from magnitude_tui.engine.events import ThreadState

    app = _PanelApp()
    async with app.run_test(size=(60, 30)):
        panel = app.query_one(SchedulerPanel)
        panel.record(StepReport(**STEP))
        assert "threads" not in panel.render().plain  # a backend with no CPU threads to choose
        panel.record(StepReport(**STEP, threads=ThreadState(1, 2, "fastest measured, switched from 2 "
                                                               "(2 took 5.8x as long)", others_cores=1.0)))
        text = panel.render().plain
        assert "threads 1 of 2 · others 1.0 cores" in text
        assert "fastest measured, switched from 2" in text


async def test_the_panel_shows_the_host_memory_tier_once_it_holds_something():
    from magnitude_tui.engine.events import RamTierState

    app = _PanelApp()
    async with app.run_test(size=(60, 30)):
        panel = app.query_one(SchedulerPanel)
        panel.record(StepReport(**STEP))
        assert "host" not in panel.render().plain
        panel.record(StepReport(**STEP, ram=RamTierState(48 << 20, 2 << 30, 2, 5)))
        assert "host    48/2048 MB · 2 held · 5 restored" in panel.render().plain
