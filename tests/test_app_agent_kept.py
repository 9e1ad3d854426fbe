"""Pilot tests: an agent pane's tool turns (its calls and their results) are part of the
conversation: saved in the store as they happen, sent again on the pane's next turn, shown as
tool blocks when the conversation is reopened, and written by the Markdown export. Before, only
the turns' text was kept: a reopened agent pane had lost what its tools had read, and its next
turn was asked without it."""

from __future__ import annotations

from magnitude_tui.engine.events import SeqUpdate, StepReport
from magnitude_tui.export import pane_markdown
from magnitude_tui.records import NOT_RUN
from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.store import Store
from magnitude_tui.widgets.tool_block import ToolBlock
from magnitude_tui.widgets.transcript import Transcript
from scheduler.types import DoneReason, ErrorKind, Phase
from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
from tests.app_support import settle, type_message, wait_for


def read_then_answer(request):
    """A read (the first turn writes no text), then an answer quoting it."""
    if not tool_results(request):
        return [("read_file", {"path": "r.txt"})]
    return "it says " + tool_results(request)[-1].strip()


def kept_parts(messages):
    return [(m.role, m.content, [c.name for c in m.tool_calls], m.call and m.call.name) for m in messages]


async def test_tool_turns_are_saved_resent_and_shown_after_a_reopen(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")
    client = ToolClient(read_then_answer)
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent what is in r.txt")
        await drive(pilot, client, lambda: not app.workspace.agents.running(pane) and pane.last_answer(), "the answer")
        await settle(pilot)
        [block] = pane.query(ToolBlock)
        assert block.tool == "read_file" and "inside" in block.result and block.ok
        result = block.result
        answer = pane.last_answer()
        assert answer == "it says " + result.strip()

    # What the store holds: the task, the turn that called read_file (no text), its result, the answer.
    store = Store(tmp_path / "magnitude.db")
    [record] = store.open_workspace(resume=True)
    assert kept_parts(record.messages) == [
        ("user", "what is in r.txt", [], None),
        ("assistant", "", ["read_file"], None),
        ("tool", result, [], "read_file"),
        ("assistant", answer, [], None),
    ]
    call = record.messages[1].tool_calls[0]
    assert record.messages[2].call == call and '"r.txt"' in call.arguments
    store.close()

    client = ToolClient(read_then_answer)
    async with agent_app(tmp_path, client, roles={}, resume=True) as (app, pilot):
        ws = app.workspace
        [pane] = ws.grid.panes
        await settle(pilot)
        # The reopened transcript shows the call as a block again (with its arguments and result).
        [block] = pane.query(ToolBlock)
        assert (block.tool, block.result) == ("read_file", result) and "r.txt" in block.summary()
        markdown = pane_markdown(pane)
        assert "## tool result: `read_file` (ok" in markdown and "inside" in markdown
        assert "called `read_file` with" in markdown
        # The next turn is asked with the earlier call and its result in its history: the model
        # answers from what it read instead of reading again.
        await type_message(pilot, "/agent and what did it say")
        await drive(pilot, client, lambda: client.submitted and not ws.agents.running(pane)
                    and len(pane.record.messages) > 5, "the second answer")
        sent = client.submitted[0].messages
        assert [(m.role, m.name) for m in sent if m.role == "tool"] == [("tool", "read_file")]
        [asked] = [m for m in sent if m.tool_calls]
        assert asked.tool_calls[0].id == sent[[m.role for m in sent].index("tool")].tool_call_id
        assert len(client.submitted) == 1  # answered from the history, no second read


async def test_a_plain_turn_after_an_agent_run_keeps_the_tool_turns_in_its_context(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")
    client = ToolClient(read_then_answer)
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent what is in r.txt")
        await drive(pilot, client, lambda: not ws.agents.running(pane) and pane.last_answer(), "the answer")
        before = len(client.submitted)
        await type_message(pilot, "thanks, now summarise")
        await wait_for(pilot, lambda: len(client.submitted) > before, what="the plain turn")
        plain = client.submitted[before]
        assert not plain.tools  # a plain chat turn
        assert [m.role for m in plain.messages] == ["user", "assistant", "tool", "assistant", "user"]
        assert "inside" in plain.messages[2].content and plain.messages[1].tool_calls[0].name == "read_file"


async def test_a_reopened_block_keeps_its_wait_for_approval(tmp_path):
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("write_file", {"path": "w.txt", "content": "x"})] if not tool_results(r)
                        else "written")
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent write it")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.pause(0.3)
        await pilot.press("y")
        await drive(pilot, client, lambda: pane.last_answer() == "written", "the answer")
        await settle(pilot)
        [block] = pane.query(ToolBlock)
        assert block.approval_wait_s is not None and block.approval_wait_s >= 0.3
        live = block.summary()

    async with agent_app(tmp_path, ToolClient(lambda r: "unused"), roles={}, resume=True) as (app, pilot):
        [pane] = app.workspace.grid.panes
        await settle(pilot)
        [block] = pane.query(ToolBlock)
        assert block.summary() == live and "for approval" in live


def test_a_tool_parts_table_without_the_approval_wait_gains_it(tmp_path):
    # tool_parts first shipped without approval_wait_s; reading such a file failed with
    # "no such column: t.approval_wait_s" and the app could not start.
    import sqlite3

    from magnitude_tui.store import MessageRecord, PaneRecord
    from scheduler.types import ToolCall

    path = tmp_path / "magnitude.db"
    store = Store(path)
    store.open_workspace(resume=False)
    call = ToolCall("c1", "read_file", '{"path": "r.txt"}')
    store.add_pane(PaneRecord("p1", "A1", messages=[
        MessageRecord("user", "read it"), MessageRecord("assistant", "", tool_calls=(call,)),
        MessageRecord("tool", "inside", call=call, duration_s=0.5)]))
    store.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE tool_parts DROP COLUMN approval_wait_s")
    db.commit()
    db.close()
    store = Store(path)
    [record] = store.open_workspace(resume=True)
    assert record.messages[2].call == call and record.messages[2].approval_wait_s is None
    assert [r.messages for r in store.conversations()] == [1]  # the task; not the call or its result
    store.close()


class _TightClient(ToolClient):
    """Refuses a request whose messages hold over LIMIT characters, as the engine refuses a
    prompt over the context (CONTEXT_LENGTH): the agent loop then cuts the newest tool results."""

    LIMIT = 20_000

    def submit(self, request):
        size = sum(len(m.content) for m in request.messages)
        if size <= self.LIMIT:
            return super().submit(request)
        self.submitted.append(request)
        refusal = SeqUpdate(request.request_id, request.session_id, None, Phase.DONE, done_reason=DoneReason.ERROR,
                            error_kind=ErrorKind.CONTEXT_LENGTH, error=f"{size} characters do not fit")
        self._emit([StepReport(999, 1.0, 30.0, 0, 0, 40, 300, 8192, 0, 0, self.policy, [refusal])])


def _read_once_per_task(request):
    last_task = max(i for i, m in enumerate(request.messages) if m.role == "user")
    if not any(m.role == "tool" for m in request.messages[last_task:]):
        return [("read_file", {"path": "big.txt"})]
    return f"answer {sum(m.role == 'user' for m in request.messages)}"


async def test_a_result_cut_to_fit_is_kept_as_the_model_saw_it(tmp_path):
    # The loop cut a result that did not fit, but the pane saved it whole: after a reopen the
    # history held it whole again, and every later /agent run failed with "outgrew the context".
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "big.txt").write_text("line of text\n" * 3000)  # 39,000 characters
    client = _TightClient(_read_once_per_task)
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent read big.txt")
        await drive(pilot, client, lambda: not app.workspace.agents.running(pane) and pane.last_answer(), "the answer")
        [result] = [m for m in pane.record.messages if m.call is not None]
        assert len(result.content) < _TightClient.LIMIT and "characters cut" in result.content

    client = _TightClient(_read_once_per_task)
    async with agent_app(tmp_path, client, roles={}, resume=True) as (app, pilot):
        ws = app.workspace
        [pane] = ws.grid.panes
        before = len(pane.record.messages)
        await type_message(pilot, "/agent and once more")
        await drive(pilot, client, lambda: not ws.agents.running(pane) and len(pane.record.messages) > before + 3,
                    "the second run's answer")
        assert pane.last_answer() == "answer 2"


async def test_a_call_left_unanswered_by_a_stopped_agent_is_answered_not_run(tmp_path):
    # Stopped at the approval dialog (s), the agent left its call without a result; the next turn
    # sent that call unanswered, which OpenAI-compatible servers refuse (a 400 on every turn).
    (tmp_path / "work").mkdir()
    client = ToolClient(lambda r: [("write_file", {"path": "w.txt", "content": "x"})] if r.tools else "ok")
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent write it")
        await drive(pilot, client, lambda: isinstance(app.screen, ApprovalDialog), "the approval")
        await pilot.press("s")
        await wait_for(pilot, lambda: not ws.agents.running(pane), what="the agent to stop")
        before = len(client.submitted)
        await type_message(pilot, "never mind")
        await wait_for(pilot, lambda: len(client.submitted) > before, what="the plain turn")
        sent = client.submitted[before].messages
        [asked] = [m for m in sent if m.tool_calls]
        following = sent[sent.index(asked) + 1]
        assert (following.role, following.tool_call_id) == ("tool", asked.tool_calls[0].id)
        assert following.content == NOT_RUN
        assert not (tmp_path / "work" / "w.txt").exists()


async def test_a_reopened_pane_with_a_long_tool_result_still_shows_its_task(tmp_path):
    # The transcript's budget counted a result's whole text, though it shows as a one-line block:
    # one 26,000-character read hid the task above "▲ 2 earlier messages not shown".
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "big.txt").write_text("line of text\n" * 2000)
    client = ToolClient(lambda r: [("read_file", {"path": "big.txt"})] if not tool_results(r) else "read it")
    async with agent_app(tmp_path, client) as (app, pilot):
        pane = app.workspace.grid.panes[0]
        await type_message(pilot, "/agent read big.txt")
        await drive(pilot, client, lambda: not app.workspace.agents.running(pane) and pane.last_answer(), "the answer")

    async with agent_app(tmp_path, ToolClient(lambda r: "unused"), roles={}, resume=True) as (app, pilot):
        [pane] = app.workspace.grid.panes
        await settle(pilot)
        transcript = pane.query_one(Transcript)
        assert transcript.hidden == 0
        assert [v.message.role for v in transcript.views() if v.display] == ["user", "tool", "assistant"]


async def test_a_tool_block_shows_before_the_next_turns_reply_when_the_paint_comes_late(tmp_path):
    # The paint tick waits while keys come and for background panes: when it came after the next
    # turn had started streaming, the reply was painted above the block of the call before it.
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "r.txt").write_text("inside\n")
    client = ToolClient(lambda r: [("read_file", {"path": "r.txt"})] if not tool_results(r) else "the answer")
    async with agent_app(tmp_path, client) as (app, pilot):
        ws = app.workspace
        pane = ws.grid.panes[0]
        await type_message(pilot, "/agent read r.txt")
        await drive(pilot, client, lambda: len(client.submitted) >= 1, "the first turn")
        paint = ws.painter.paint

        async def late() -> None:
            pass

        ws.painter.paint = late
        await drive(pilot, client, lambda: pane.has_ended and pane.last_answer() == "the answer", "the answer")
        ws.painter.paint = paint
        await settle(pilot)
        shown = [v.message.role for v in pane.query_one(Transcript).views() if v.display]
        assert shown == ["user", "tool", "assistant"]
