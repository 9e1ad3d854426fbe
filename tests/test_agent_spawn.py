"""spawn_agents on a scripted fake engine: three subagents forked from the caller's KV, their answers as the call's result, approval naming the parent, and the bounds."""

from __future__ import annotations

import json
import re

import pytest

from magnitude_tui.agent.config import SpawnLimits
from magnitude_tui.agent.events import SubagentSpawned, TurnFinished
from magnitude_tui.agent.policy import ALLOW_ONCE, ApprovePolicy, FixedApproval
from magnitude_tui.agent.team import AgentTeam
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings
from tests.test_agent_support import call, last_user, scripted_engine

TASKS = ["count the files", "name the language", "find the version"]
SUB = re.compile(r"You are subagent (\d+) of (\d+)")


def spawning(sub_reply=lambda k, prompt: f"answer-{k}", tasks=TASKS):
    def script(prompt: str) -> str:
        user = last_user(prompt)
        m = SUB.search(user)
        if m:
            return sub_reply(int(m.group(1)), prompt)
        if user.startswith("<tool_response>"):
            return "All three reported."
        return call("spawn_agents", agents=[{"task": t} for t in tasks])
    return script


async def test_three_subagents_answer_as_the_call_result_from_forked_sessions(tmp_path):
    events = []
    async with scripted_engine(spawning()) as (runner, backend, client):
        team = AgentTeam(runner, Workspace(tmp_path), observer=events.append)
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("survey the repo")
    assert out.ok and out.answer == "All three reported."
    result = json.loads(out.messages[-2].content)
    assert [(r["agent"], r["task"], r["ended"], r["answer"]) for r in result] == [
        ("main/1", TASKS[0], "answered", "answer-1"), ("main/2", TASKS[1], "answered", "answer-2"),
        ("main/3", TASKS[2], "answered", "answer-3")]
    spawned = [e for e in events if isinstance(e, SubagentSpawned)]
    assert [(e.agent, e.child, e.session_id) for e in spawned] == [
        ("main", "main/1", "main-1"), ("main", "main/2", "main-2"), ("main", "main/3", "main-3")]
    assert sorted(client.closed_sessions) == ["main-1", "main-2", "main-3"]  # their KV is freed
    turns = {e.agent: e for e in events if isinstance(e, TurnFinished) and e.turn == 1}
    # Each subagent starts from the parent's conversation: all of the parent's prompt comes from
    # its KV except the header of the turn that called (the subagent's next turn is a user's).
    for k in (1, 2, 3):
        sub = turns[f"main/{k}"]
        assert sub.cached_tokens == turns["main"].prompt_tokens - len("assistant\n"), sub
        assert sub.prompt_tokens - sub.cached_tokens < 200
    # The subagents saw the parent's task (their history is the parent's conversation).
    assert all("survey the repo" in p for p in backend.prompts if SUB.search(p))


async def test_a_subagents_approval_request_names_it_and_its_parent(tmp_path):
    def sub_reply(k, prompt):
        if last_user(prompt).startswith("<tool_response>"):
            return f"ran-{k}"
        return call("run_command", command=f"echo {k} > out{k}.txt") if k == 1 and "out1" not in prompt else f"skip-{k}"

    def script(prompt):
        user = last_user(prompt)
        if "<tool_response>\nexit status" in user:
            return "ran-1"
        return spawning(sub_reply)(prompt)

    approval = FixedApproval(ALLOW_ONCE)
    async with scripted_engine(script) as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), approval=approval)
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("do it")
    assert out.ok
    (asked,) = approval.asked
    assert (asked.agent, asked.parent, asked.tool) == ("main/1", "main", "run_command")
    assert (tmp_path / "out1.txt").read_text() == "1\n"


async def test_a_subagent_never_gets_more_freedom_than_its_parent(tmp_path):
    roles = {"yolo": AgentSettings("yolo", "You act.", approve=ApprovePolicy.AUTO)}

    async with scripted_engine(lambda p: "ok") as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), roles=roles)
        parent = team.agent(AgentSettings(), name="main", session_id="main", policy=ApprovePolicy.READ_ONLY)
        child = team.agent(roles["yolo"], name="main/1", session_id="main-1", parent=parent)
    assert child.gate.policy is ApprovePolicy.READ_ONLY and "run_command" not in child.tools
    assert child.config.fork_from == "main" and child.config.depth == 1 and child.config.parent == "main"


async def test_an_auto_subagent_asks_for_the_tools_its_auto_parent_could_not_use(tmp_path):
    # A reader role (read tools only, approve = "auto") spawning a role with every tool and
    # approve = "auto": both are auto, so the stricter policy kept auto, and the child ran
    # commands and writes unasked that its parent could not run at all.
    roles = {"reader": AgentSettings("reader", tools=("read_file", "spawn_agents"), approve=ApprovePolicy.AUTO),
             "yolo": AgentSettings("yolo", "You act.", approve=ApprovePolicy.AUTO)}

    def script(prompt: str) -> str:
        user = last_user(prompt)
        if SUB.search(user):
            return call("run_command", command="echo hi > ran.txt") if "<tool_response>" not in user else "done"
        if user.startswith("<tool_response>"):
            return "reported"
        return call("spawn_agents", agents=[{"task": "act", "role": "yolo"}])

    approval = FixedApproval(ALLOW_ONCE)
    async with scripted_engine(script) as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), roles=roles, approval=approval)
        parent = team.agent(roles["reader"], name="main", session_id="main")
        assert "run_command" not in parent.tools
        child = team.agent(roles["yolo"], name="main/9", session_id="main-9", parent=parent)
        assert child.gate.policy is ApprovePolicy.AUTO and "run_command" in child.tools
        assert child.gate.needs_asking(child.tools["run_command"].kind, "run_command")
        assert not child.gate.needs_asking(child.tools["read_file"].kind, "read_file")
        out = await parent.run("look around")
    assert out.ok
    assert [(a.agent, a.tool) for a in approval.asked] == [("main/1", "run_command")]
    assert (tmp_path / "ran.txt").exists()  # allowed when asked: it ran


async def test_an_auto_subagent_of_an_auto_parent_with_the_same_tools_runs_unasked(tmp_path):
    roles = {"yolo": AgentSettings("yolo", "You act.", approve=ApprovePolicy.AUTO)}
    async with scripted_engine(lambda p: "ok") as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), roles=roles, approval=FixedApproval(ALLOW_ONCE))
        parent = team.agent(roles["yolo"], name="main", session_id="main")
        child = team.agent(roles["yolo"], name="main/1", session_id="main-1", parent=parent)
    assert not child.gate.ask_anyway and not child.gate.needs_asking(child.tools["run_command"].kind, "run_command")


@pytest.mark.parametrize("limits, tasks, why", [
    (SpawnLimits(max_per_call=2), TASKS, "at most 2 subagents per call"),
    (SpawnLimits(max_total=2), TASKS, "3 more were asked for"),
    (SpawnLimits(max_depth=0), TASKS, "nested deeper than 0"),
])
async def test_spawn_bounds_are_refused_as_the_result(tmp_path, limits, tasks, why):
    async with scripted_engine(spawning(tasks=tasks)) as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), limits=limits)
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("go")
    assert out.ok and out.messages[-2].content.startswith("refused:") and why in out.messages[-2].content


async def test_nesting_stops_at_the_configured_depth(tmp_path):
    def script(prompt):
        user = last_user(prompt)
        if SUB.search(prompt) and user.startswith("<tool_response>"):  # the subagent's second turn
            return "gave up nesting" if "refused: subagents may not be nested deeper than 1" in user else "?"
        if SUB.search(user):
            return call("spawn_agents", agents=[{"task": "deeper"}])
        return "done" if user.startswith("<tool_response>") else call("spawn_agents", agents=[{"task": "one"}])

    async with scripted_engine(script) as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), limits=SpawnLimits(max_depth=1))
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("go")
    (entry,) = json.loads(out.messages[-2].content)
    assert entry["answer"] == "gave up nesting" and team.spawned == 1


async def test_an_unknown_role_is_refused_with_the_known_ones(tmp_path):
    script = lambda p: ("fine" if last_user(p).startswith("<tool_response>")
                        else call("spawn_agents", agents=[{"task": "x", "role": "critc"}]))
    async with scripted_engine(script) as (runner, _, _):
        team = AgentTeam(runner, Workspace(tmp_path), roles={"critic": AgentSettings("critic", "Be harsh.")})
        out = await team.agent(AgentSettings(), name="main", session_id="main").run("go")
    assert "unknown role 'critc' (did you mean critic?)" in out.messages[-2].content
