"""Pilot tests of the app on the real engine (WorkerClient in process, fake backend)."""

from __future__ import annotations

from backend.factory import BackendConfig
from backend.fake import DEFAULT_REPLY
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.widgets.scheduler_panel import SchedulerPanel
from magnitude_tui.widgets.status_line import StatusLine
from scheduler.types import Phase, SamplingParams
from tests.app_support import PACED, SIZE, make_app, wait_for

ENDLESS = SamplingParams(max_tokens=1_000_000)


def _engine_app(tmp_path, *, max_tokens: int, policy: str = "fixed:64", backend: str = "fake"):
    config = EngineConfig(BackendConfig(backend, n_ctx=65536, n_seq_max=16, realtime=backend != "fake"),
                          policy=policy)
    client = WorkerClient(config, in_process=True)
    return make_app(tmp_path, client, sampling=SamplingParams(max_tokens=max_tokens)), client


async def _ready(pilot, app) -> None:
    await wait_for(pilot, lambda: app.workspace.engine_ready, what="EngineReady")


async def _say(pilot, text: str) -> None:
    """Type short text key by key; paste long text into the focused composer, then Enter."""
    if len(text) > 24:
        pilot.app.focused.insert(text)
        await pilot.press("enter")
    else:
        await pilot.press(*text, "enter")
    await pilot.pause()


def _expected(n: int) -> str:
    return (DEFAULT_REPLY * (n // len(DEFAULT_REPLY) + 1))[:n]


async def test_two_panes_stream_to_the_end(tmp_path):
    app, _ = _engine_app(tmp_path, max_tokens=60)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        await _say(pilot, "first")
        await pilot.press("ctrl+n")
        await _say(pilot, "second")
        a1, a2 = app.workspace.grid.panes
        await wait_for(pilot, lambda: not a1.busy and not a2.busy, what="both replies")
        for pane in (a1, a2):
            assert pane.record.messages[-1].content == _expected(60)
            assert pane.record.messages[-1].done_reason == "length"
            assert pane.replies.last_update.generated == 60 and pane.replies.last_update.ttft_ms is not None
        assert {a1.replies.last_update.seq_id, a2.replies.last_update.seq_id} == {0, 1}


async def test_escape_cancels_one_pane_and_the_other_carries_on(tmp_path):
    # Paced: the endless reply must not reach the context's end before the keys.
    app, _ = _engine_app(tmp_path, max_tokens=ENDLESS.max_tokens, backend=PACED)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        # Two subagents start in the same step: typing into a second pane while the fake engine
        # streams thousands of tokens a second would take longer than a reply lasts.
        await _say(pilot, "/spawn 2 keep talking")
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 3, what="two subagent panes")
        _, c1, c2 = app.workspace.grid.panes
        generating = lambda p: (p.replies.last_update is not None  # noqa: E731
                                and p.replies.last_update.phase is Phase.GENERATING)
        await wait_for(pilot, lambda: generating(c1) and generating(c2), what="both generating")
        await pilot.press("tab", "escape")  # focus A1.1, cancel it
        await wait_for(pilot, lambda: not c1.busy, what="A1.1 cancelled")
        assert c1.replies.last_update.done_reason.value == "cancelled"
        before = c2.replies.last_update.generated
        await wait_for(pilot, lambda: c2.replies.last_update.generated > before + 20, what="A1.2 still generating")
        assert c2.busy
        await pilot.press("tab", "escape")
        await wait_for(pilot, lambda: not c2.busy, what="A1.2 cancelled")


async def test_spawn_three_subagents_fork_and_report_back(tmp_path):
    app, client = _engine_app(tmp_path, max_tokens=30)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        await _say(pilot, "a long shared context " * 20)
        parent = app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: not parent.busy, what="parent reply")
        await _say(pilot, "/spawn 3 name one risk")
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 4, what="three subagent panes")
        children = app.workspace.grid.panes[1:]
        await wait_for(pilot, lambda: len([m for m in parent.record.messages if m.author]) == 3,
                       what="three answers posted back")
        for child in children:
            assert child.record.messages[-1].content == _expected(30)
            # Forked from the parent's KV: only the task message had to be prefilled.
            assert child.replies.last_update.cached_tokens > 0
        assert all(_expected(30) in m.content for m in parent.record.messages if m.author)


async def test_close_pane_frees_its_sequence(tmp_path):
    # Paced: the endless reply must not reach the context's end before the keys.
    app, _ = _engine_app(tmp_path, max_tokens=ENDLESS.max_tokens, backend=PACED)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        await pilot.press("ctrl+n")
        await _say(pilot, "endless")
        panel = app.workspace.query_one(SchedulerPanel)
        await wait_for(pilot, lambda: panel.steps and panel.steps[-1].running == 1, what="A2 running")
        await pilot.press("ctrl+x", "y")  # it is replying: confirmed in the dialog
        await wait_for(pilot, lambda: len(app.workspace.grid.panes) == 1, what="A2 closed")
        await _say(pilot, "short one")  # A1 now; its steps show A2's sequence gone
        await wait_for(pilot, lambda: panel.steps[-1].running == 1 and panel.steps[-1].decode_rows == 1,
                       what="one running sequence")
        await pilot.press("escape")


async def test_policy_switch_reaches_the_engine(tmp_path):
    app, _ = _engine_app(tmp_path, max_tokens=20)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        await _say(pilot, "/policy fixed:16")
        panel = app.workspace.query_one(SchedulerPanel)
        await wait_for(pilot, lambda: panel.policy == "fixed:16", what="PolicyChanged")
        await _say(pilot, "x" * 100)
        pane = app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: not pane.busy, what="reply")
        prefill_steps = [r for r in panel.steps if r.prefill_rows]
        assert prefill_steps and all(r.policy == "fixed:16" and r.prefill_rows <= 16 for r in prefill_steps)


async def test_speculation_switches_live_from_the_palette_and_shows_its_figures(tmp_path):
    from magnitude_tui.widgets.sequences_panel import spec_text

    app, _ = _engine_app(tmp_path, max_tokens=120)
    async with app.run_test(size=SIZE) as pilot:
        await _ready(pilot, app)
        panel = app.workspace.query_one(SchedulerPanel)
        assert panel.spec == "auto"  # EngineConfig's default, from EngineReady
        commands = {c.title: c for c in app.get_system_commands(app.workspace)}
        commands["Speculation: draft"].callback()  # no draft model: refused, nothing changes
        commands["Speculation: ngram"].callback()
        await wait_for(pilot, lambda: panel.spec == "ngram", what="SpecChanged")
        await _say(pilot, "go")
        pane = app.workspace.grid.panes[0]
        await wait_for(pilot, lambda: not pane.busy, what="reply")
        # The fake's reply repeats every 45 characters: from its second round on, lookup guesses it.
        assert pane.record.messages[-1].content == _expected(120)
        last = pane.replies.last_update
        assert last.spec.accepted > 0 and last.spec.tokens_per_step > 1.5
        assert spec_text(last).endswith("%") and "tok/step" in StatusLine.metrics_text(last)
        assert sum(r.draft_rows for r in panel.steps) >= last.spec.drafted
        commands["Speculation: off"].callback()
        await wait_for(pilot, lambda: panel.spec == "off", what="SpecChanged off")
