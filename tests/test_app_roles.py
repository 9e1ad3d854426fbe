"""Agents with roles: agents.toml, /spawn ROLE, the agent dialog (f6), the role in the title."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

import magnitude_tui.app
from magnitude_tui.agents import AgentFileError, AgentSettings, load_agents
from magnitude_tui.cli import app as cli
from magnitude_tui.screens.agent_dialog import AgentDialog
from magnitude_tui.store import PaneRecord, Store
from scheduler.types import SamplingParams
from tests.app_support import SIZE, ScriptedClient, make_app, settle, wait_for
from tests.gguf_files import tiny_gguf

CRITIC = AgentSettings("critic", "You find the weakest point.", 0.2, 50)


def test_agents_toml_defines_roles(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text('[critic]\nsystem = "You find the weakest point."\ntemperature = 0.2\nmax_tokens = 50\n'
                    '[scribe]\nsystem = "You write it down."\n')
    assert load_agents(path) == {"critic": CRITIC, "scribe": AgentSettings("scribe", "You write it down.")}
    with pytest.raises(AgentFileError, match="none.toml: no such file"):
        load_agents(tmp_path / "none.toml")  # named with --agents: it must exist
    for bad, says in [('[x]\ntemp = 1\n', "unknown key(s) temp"), ('[x]\ntemperature = -1\n', "temperature -1"),
                      ('[x]\nmax_tokens = "a"\n', "max_tokens must be an integer"), ('x = 1\n', "must be a table"),
                      ('[x\n', "agents.toml")]:
        path.write_text(bad)
        with pytest.raises(AgentFileError, match=says.replace("(", r"\(").replace(")", r"\)")):
            load_agents(path)


def test_a_bad_agents_file_is_refused_before_the_app_opens(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: started.append(kw))
    agents = tmp_path / "agents.toml"
    agents.write_text("[critic]\ntemperature = 'hot'\n")
    model = str(tiny_gguf(tmp_path / "m.gguf"))
    result = CliRunner().invoke(cli, ["--model", model, "--agents", str(agents)])
    assert result.exit_code == 2 and not started
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "temperature must be a number" in result.stderr
    agents.write_text('[critic]\nsystem = "x"\n')
    result = CliRunner().invoke(cli, ["--model", model, "--agents", str(agents)])
    assert result.exit_code == 0 and list(started[0]["roles"].roles) == ["critic"]
    assert started[0]["roles"].path == agents  # followed: the app reads it again when it changes


def test_a_missing_agents_file_is_refused_and_the_default_one_may_be_absent(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(magnitude_tui.app, "run_app", lambda config, **kw: started.append(kw))
    model = str(tiny_gguf(tmp_path / "m.gguf"))
    missing = tmp_path / "agnets.toml"
    for extra in ([], ["--check"]):
        result = CliRunner().invoke(cli, ["--model", model, "--agents", str(missing), *extra])
        assert result.exit_code == 2 and not started and "roles: none" not in result.output
        assert f"{missing}: no such file" in result.stderr
    monkeypatch.setattr("magnitude_tui.agents.agents_path", lambda: tmp_path / "absent" / "agents.toml")
    assert load_agents() == {}
    result = CliRunner().invoke(cli, ["--model", model, "--check"])
    assert result.exit_code == 0 and "roles: none" in result.output


async def test_spawn_with_a_role_uses_its_prompt_and_sampling(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client, roles={"critic": CRITIC})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"plan a trip", "enter")
        client.run_to_completion()
        await settle(pilot)
        await pilot.press(*"/spawn critic 2 find the flaw", "enter")
        await wait_for(pilot, lambda: len(client.submitted) == 3, what="two critics")
        for request in client.submitted[1:]:
            assert request.messages[0].role == "system" and request.messages[0].content == CRITIC.system
            assert (request.sampling.temperature, request.sampling.max_tokens) == (0.2, 50)
            assert "find the flaw" in request.messages[-1].content
        children = app.workspace.grid.panes[1:]
        assert all(" · critic · find the flaw" in c.border_title for c in children)


async def test_the_agent_dialog_sets_a_panes_role_and_it_is_kept(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client, roles={"critic": CRITIC})
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.screen, AgentDialog), what="the dialog")
        await pilot.press(*"critic")
        await wait_for(pilot, lambda: app.screen.query_one("#agent-system").text == CRITIC.system,
                       what="the role's prompt filled in")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: pane.record.settings == CRITIC, what="the settings applied")
        assert pane.border_title == "A1 · critic"
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: client.submitted, what="the turn")
        request = client.submitted[0]
        assert [m.role for m in request.messages] == ["system", "user"]
        assert request.sampling.temperature == 0.2 and request.sampling.max_tokens == 50
        client.run_to_completion()
        await settle(pilot)
    again = make_app(tmp_path, ScriptedClient(), resume=True, roles={"critic": CRITIC})
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: again.workspace.grid.panes, what="the restored pane")
        assert again.workspace.grid.panes[0].record.settings == CRITIC


def test_roles_and_panes_set_top_p_and_min_p(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text('[looper]\nsystem = "Be brief."\ntop_p = 0.9\nmin_p = 0.1\n')
    [looper] = load_agents(path).values()
    assert (looper.top_p, looper.min_p) == (0.9, 0.1)
    sampling = looper.sampling(SamplingParams(temperature=0.7))
    assert (sampling.temperature, sampling.top_p, sampling.min_p) == (0.7, 0.9, 0.1)
    for bad, says in [("top_p = 1.5", "top_p 1.5"), ("min_p = 1", "min_p 1.0"), ("top_p = 'x'", "top_p must be")]:
        path.write_text(f"[x]\n{bad}\n")
        with pytest.raises(AgentFileError, match=says):
            load_agents(path)
    # A database from before these columns gains them.
    db = sqlite3.connect(tmp_path / "old.db")
    db.executescript("CREATE TABLE pane_settings (pane_id TEXT PRIMARY KEY, role TEXT, system TEXT NOT NULL, "
                     "temperature REAL, max_tokens INTEGER);")
    db.close()
    store = Store(tmp_path / "old.db")
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", settings=looper))
    assert store.pane_settings("p1") == looper
    store.close()


async def test_the_agent_dialog_sets_top_p_and_min_p(tmp_path):
    client = ScriptedClient()
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        pane = app.workspace.grid.panes[0]
        await pilot.press("f6")
        await wait_for(pilot, lambda: isinstance(app.screen, AgentDialog), what="the dialog")
        app.screen.query_one("#agent-top-p").value = "2"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: any("top_p 2.0" in n.message for n in app._notifications), what="the refusal")
        app.screen.query_one("#agent-top-p").value = "0.8"
        app.screen.query_one("#agent-min-p").value = "0.2"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: pane.record.settings.top_p == 0.8, what="the settings applied")
        await pilot.press(*"hi", "enter")
        await wait_for(pilot, lambda: client.submitted, what="the turn")
        assert (client.submitted[0].sampling.top_p, client.submitted[0].sampling.min_p) == (0.8, 0.2)
        assert app.store.pane_settings(pane.session_id).min_p == 0.2
