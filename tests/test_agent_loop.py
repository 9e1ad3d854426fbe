"""The agent loop on a scripted fake engine: read, search, edit with approval, a denied command, KV reuse between turns, tool_choice and bounds."""

from __future__ import annotations

import json

import pytest

from magnitude_tui.agent.events import (
    ApprovalDecided,
    ApprovalWaiting,
    EndReason,
    ToolFinished,
    ToolStarted,
    TurnFinished,
)
from magnitude_tui.agent.policy import ALLOW_ONCE, ALLOW_PANE, ApprovePolicy, FixedApproval, deny
from magnitude_tui.agent.team import AgentTeam
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings
from scheduler.types import SamplingParams, ToolChoiceMode
from tests.test_agent_support import call, last_user, scripted_engine


@pytest.fixture
def root(tmp_path):
    (tmp_path / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("VERSION = 1\n")
    return tmp_path


def two_turns(first: str, answer=lambda result: f"Done: {result[:40]}"):
    """A model that makes one call for the task, then answers from the tool's result."""
    def script(prompt: str) -> str:
        user = last_user(prompt)
        return answer(user) if user.startswith("<tool_response>") else first
    return script


async def run_agent(root, script, *, settings=AgentSettings(), approval=None, policy=None, events=None, **team_kw):
    async with scripted_engine(script) as (runner, backend, client):
        team = AgentTeam(runner, Workspace(root), approval=approval,
                         observer=events.append if events is not None else (lambda e: None), **team_kw)
        loop = team.agent(settings, name="main", session_id="main", policy=policy)
        out = await loop.run("the task", team.history(settings))
        return out, backend, client


async def test_read_file_result_reaches_the_model_and_only_new_tokens_are_prefilled(root):
    reply = call("read_file", path="notes.txt")
    events = []
    out, backend, _ = await run_agent(root, two_turns(reply), events=events)
    assert out.reason is EndReason.ANSWERED and out.answer.startswith("Done: <tool_response>")
    tool_msg = out.messages[-2]
    assert tool_msg.role == "tool" and "alpha\nbeta\ngamma" in tool_msg.content and tool_msg.name == "read_file"
    assert out.messages[-3].tool_calls[0].name == "read_file"
    assert "alpha\nbeta\ngamma" in backend.prompts[1]
    t1, t2 = out.turns
    # Same session: the second turn reuses the first's prompt and its reply from the KV cache; only
    # the tool result's turn is evaluated.
    assert t2.cached_tokens >= t1.prompt_tokens + len(reply) - 1
    # What is new, exactly: the reply's end marker, the result as the generic format's user turn, and
    # the next assistant header (the fake tokenizer: one token per character, one per ChatML marker).
    wrapped = f"<tool_response>\n{tool_msg.content}\n</tool_response>"
    markers = len("\n") + 1 + len("user\n") + 1 + len("\n") + 1 + len("assistant\n") + 1
    assert t2.prompt_tokens - t2.cached_tokens == len(wrapped) + markers
    started = [e for e in events if isinstance(e, ToolStarted)]
    finished = [e for e in events if isinstance(e, ToolFinished)]
    assert [e.call.name for e in started] == ["read_file"] and finished[0].ok
    assert finished[0].result_chars == len(tool_msg.content) and finished[0].duration_s >= 0
    assert not [e for e in events if isinstance(e, ApprovalWaiting)]  # reads are never asked about


async def test_search_finds_the_line(root):
    out, _, _ = await run_agent(root, two_turns(call("search", pattern="VERSION")))
    assert out.ok and "src/app.py:1: VERSION = 1" in out.messages[-2].content


async def test_edit_waits_for_approval_with_the_diff_and_then_writes(root):
    approval = FixedApproval(ALLOW_ONCE)
    events = []
    out, _, _ = await run_agent(root, two_turns(call("edit_file", path="src/app.py", old_text="VERSION = 1",
                                                     new_text="VERSION = 2")),
                                approval=approval, events=events)
    assert out.ok and (root / "src" / "app.py").read_text() == "VERSION = 2\n"
    (asked,) = approval.asked
    assert asked.tool == "edit_file" and asked.agent == "main" and asked.parent is None
    assert "-VERSION = 1" in asked.preview and "+VERSION = 2" in asked.preview
    assert json.loads(asked.arguments)["new_text"] == "VERSION = 2"
    kinds = [type(e) for e in events]
    assert kinds.index(ApprovalWaiting) < kinds.index(ApprovalDecided) < kinds.index(ToolStarted)
    assert "+VERSION = 2" in out.messages[-2].content


async def test_allow_for_the_pane_asks_once(root):
    edits = iter(["VERSION = 2", "VERSION = 3"])

    def script(prompt):
        n = prompt.count("<tool_response>\n")  # results only (the tool listing names the tag too)
        if n < 2:
            new = next(edits)
            old = f"VERSION = {n + 1}"
            return call("edit_file", path="src/app.py", old_text=old, new_text=new)
        return "Both edits made."

    approval = FixedApproval(ALLOW_PANE)
    out, _, _ = await run_agent(root, script, approval=approval)
    assert out.ok and (root / "src" / "app.py").read_text() == "VERSION = 3\n"
    assert len(approval.asked) == 1


async def test_a_denied_command_does_not_run_and_the_reason_reaches_the_model(root):
    approval = FixedApproval(deny("no network calls from this repo"))
    out, backend, _ = await run_agent(root, two_turns(call("run_command", command="touch ran")), approval=approval)
    assert out.ok and not (root / "ran").exists()
    assert out.messages[-2].content == "denied: no network calls from this repo"
    assert "denied: no network calls from this repo" in backend.prompts[1]


async def test_without_anyone_to_ask_writes_are_denied(root):
    out, _, _ = await run_agent(root, two_turns(call("write_file", path="x.txt", content="x")), approval=None)
    assert not (root / "x.txt").exists() and out.messages[-2].content.startswith("denied:")


async def test_auto_runs_commands_without_asking(root):
    approval = FixedApproval(deny("never asked"))
    out, _, _ = await run_agent(root, two_turns(call("run_command", command="echo hi > ran")),
                                approval=approval, policy=ApprovePolicy.AUTO)
    assert (root / "ran").read_text() == "hi\n" and approval.asked == []


async def test_a_read_only_role_is_not_shown_write_tools_and_cannot_call_them(root):
    role = AgentSettings("reviewer", "You review.", approve=ApprovePolicy.READ_ONLY)
    async with scripted_engine(two_turns(call("write_file", path="x.txt", content="x"))) as (runner, backend, _):
        team = AgentTeam(runner, Workspace(root), approval=FixedApproval(ALLOW_ONCE))
        loop = team.agent(role, name="main", session_id="main")
        assert set(loop.tools) == {"read_file", "list_dir", "search", "spawn_agents"}
        out = await loop.run("review", team.history(role))
    assert not (root / "x.txt").exists()
    assert "not among the tools" in out.messages[-2].content
    assert backend.prompts[0].startswith("<|im_start|>system\nYou review.")


async def test_role_tools_limit_what_the_model_sees(root):
    role = AgentSettings("reader", tools=("read_file",))
    async with scripted_engine(lambda p: "ok") as (runner, _, _):
        team = AgentTeam(runner, Workspace(root))
        assert list(team.agent(role, name="main", session_id="main").tools) == ["read_file"]
        with pytest.raises(ValueError, match="known tools: read_file"):
            team.agent(AgentSettings("x", tools=("rm_rf",)), name="m2", session_id="m2")


async def test_arguments_that_break_the_schema_are_answered_with_the_reason(root):
    out, _, _ = await run_agent(root, two_turns(call("read_file", file="notes.txt")))
    assert out.ok and out.messages[-2].content.startswith("error: the model's arguments for 'read_file'")


async def test_tool_choice_required_applies_to_the_first_turn_only(root):
    role = AgentSettings("lister", tool_choice=ToolChoiceMode.REQUIRED)
    seen = []
    async with scripted_engine(two_turns(call("list_dir", path="."))) as (runner, _, _):
        turn = runner.turn

        async def recording(request, on_text):
            seen.append(request)
            return await turn(request, on_text)

        runner.turn = recording
        team = AgentTeam(runner, Workspace(root))
        out = await team.agent(role, name="main", session_id="main").run("list")
    assert out.ok
    assert [r.tool_choice.mode for r in seen] == [ToolChoiceMode.REQUIRED, ToolChoiceMode.AUTO]
    assert {r.session_id for r in seen} == {"main"}


async def test_the_turn_bound_ends_a_loop_that_never_answers(root):
    out, _, _ = await run_agent(root, lambda p: call("list_dir", path="."), max_turns=3)
    assert out.reason is EndReason.MAX_TURNS and len(out.turns) == 3 and "3 turns" in out.error


async def test_turn_events_carry_token_counts(root):
    events = []
    await run_agent(root, two_turns(call("list_dir")), events=events)
    turns = [e for e in events if isinstance(e, TurnFinished)]
    assert [t.turn for t in turns] == [1, 2] and all(t.prompt_tokens > 0 for t in turns)


async def test_a_conversation_that_outgrows_the_context_fails_instead_of_losing_the_task(root):
    # Each read adds about 4,000 tokens (the fake tokenizer: one a character); the fourth turn no
    # longer fits. Dropping the oldest turns would drop the task: the model must never be asked
    # to go on without it.
    (root / "big.txt").write_text("a line of the big file\n" * 170)

    def script(prompt: str) -> str:
        return call("read_file", path="big.txt") if "the task" in prompt else "an answer to no task"

    async with scripted_engine(script, n_ctx=16384, n_seq_max=1) as (runner, backend, _):
        team = AgentTeam(runner, Workspace(root))
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("the task")
    assert out.reason is EndReason.FAILED and "outgrew the context" in out.error, out.error
    assert len(out.turns) >= 3 and all("the task" in p for p in backend.prompts)


async def test_a_call_cut_at_max_tokens_is_answered_with_the_limit(root):
    # The reply ends inside write_file's arguments: the model is told why, not only "not JSON".
    reply = call("write_file", path="long.txt", content="x" * 200)
    out, _, _ = await run_agent(root, two_turns(reply), sampling=SamplingParams(max_tokens=60))
    result = out.messages[-2]
    assert result.role == "tool" and result.content.startswith("error: the reply reached its limit of 60 tokens")
    assert "smaller calls" in result.content and not (root / "long.txt").exists()


async def test_a_tool_result_too_big_for_the_context_is_cut_to_fit_and_the_agent_answers(root):
    # One read of a file larger than the whole context (the fake tokenizer: a token a character)
    # failed the run with "outgrew the context"; the result is now halved until the turn fits,
    # its head kept and the cut said.
    (root / "big.txt").write_text("".join(f"line {i:05d}\n" for i in range(1200)))  # 13,200 characters

    def script(prompt: str) -> str:
        answered = last_user(prompt).startswith("<tool_response>")
        return "it starts with line 00000" if answered else call("read_file", path="big.txt")

    async with scripted_engine(script, n_ctx=8192, n_seq_max=1) as (runner, backend, _):
        team = AgentTeam(runner, Workspace(root))
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("the task")
    assert out.reason is EndReason.ANSWERED, out.error
    shown = next(m.content for m in out.messages if m.role == "tool")
    assert "line 00000" in shown and "characters cut: the whole result did not fit in the context]" in shown
    assert len(shown) < 8192 and "the task" in backend.prompts[-1]
    # The turn asked again is still one turn, its refused attempts recorded with it.
    assert [t.turn for t in out.turns] == [1, 2] and out.turns[1].attempts == len(out.turns[1].retries) + 1 > 1


async def test_a_preview_that_raises_is_the_calls_result_and_nothing_runs(root):
    # A preview runs before anyone is asked; an exception in it (a bug, or an OS surprise such as
    # a symbolic link loop) went out of the loop and ended the agent, where a run's does not.
    from magnitude_tui.agent.loop import AgentConfig, AgentLoop
    from magnitude_tui.agent.policy import ApprovalGate, ToolKind
    from magnitude_tui.agent.toolbox import AgentTool, ToolResult, function_tool

    ran = []

    async def run(args):
        ran.append(args)
        return ToolResult("ran")

    def preview(args):
        raise RuntimeError("the preview broke")

    tool = AgentTool(function_tool("poke", "Poke.", {"x": {"type": "string"}}, ["x"]), ToolKind.WRITE, run, preview)
    async with scripted_engine(two_turns(call("poke", x="1"))) as (runner, _, _):
        loop = AgentLoop(runner, AgentConfig("main", "main"), [tool], ApprovalGate(ApprovePolicy.AUTO, None))
        out = await loop.run("the task")
    assert out.ok and not ran
    assert out.messages[-2].content == "error: poke failed before it ran (preparing it): RuntimeError: the preview broke"
