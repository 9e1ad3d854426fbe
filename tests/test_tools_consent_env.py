"""run_command ran with the app's whole environment: an approved `env` or `curl ... $OPENAI_API_KEY`
showed the model every API key. Variables whose names look secret are withheld (the approval says
which), the agents file's `[run_command] pass_env` passes named ones, and the rest still pass."""

from __future__ import annotations

import asyncio
import io
import json
import os
import textwrap

import pytest

from magnitude_tui.agent.command import CommandTool, command_env, looks_secret
from magnitude_tui.agent.config import load_agent_config
from magnitude_tui.agent.headless import RunOptions, run_task
from magnitude_tui.agent.policy import ALLOW_ONCE, FixedApproval
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentFileError, load_agents
from tests.test_agent_support import call, last_user, scripted_engine

SECRETS = {"OPENAI_API_KEY": "sk-openai-value", "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
           "GITHUB_TOKEN": "ghp-token-value", "db_password": "pw-value", "Gcp_Credentials": "cred-value",
           "MY_PASSWD": "passwd-value", "GPG_PASSPHRASE": "phrase-value",
           # Short spellings, as a whole part of the name (found by review: they passed).
           "DB_PASS": "pass-value", "MYSQL_PWD": "mysql-value", "GH_PAT": "pat-value"}
PLAIN = {"HOME": "/home/someone", "LANG": "C.UTF-8", "EDITOR": "vi", "SSH_AUTH_SOCK": "/tmp/agent.sock",
         "COMPASS_DIR": "/opt/compass", "PATH_EXTRA": "/opt/bin"}


@pytest.fixture
def environ(monkeypatch):
    for name, value in {**SECRETS, **PLAIN}.items():
        monkeypatch.setenv(name, value)


def command_output(ws, command="env"):
    result = asyncio.run(CommandTool(ws).tool().run({"command": command}))
    assert result.ok, result.text
    return dict(line.split("=", 1) for line in result.text.splitlines()[1:] if "=" in line)


def test_a_command_does_not_see_variables_whose_names_look_secret(tmp_path, environ):
    seen = command_output(Workspace(tmp_path))
    assert not set(SECRETS) & set(seen)
    assert {name: seen.get(name) for name in PLAIN} == PLAIN
    assert seen["PATH"] and seen["PWD"]  # the shell still finds programs; PWD is no password
    # Not in a value either: `echo $OPENAI_API_KEY` prints nothing.
    text = asyncio.run(CommandTool(Workspace(tmp_path)).tool().run({"command": 'echo "[$OPENAI_API_KEY]"'})).text
    assert text == "exit status 0\n[]\n"


def test_pass_env_passes_the_named_variables_and_patterns(tmp_path, environ):
    seen = command_output(Workspace(tmp_path, pass_env=("GITHUB_TOKEN", "AWS_*")))
    assert seen["GITHUB_TOKEN"] == "ghp-token-value" and seen["AWS_SECRET_ACCESS_KEY"] == "aws-secret-value"
    assert "OPENAI_API_KEY" not in seen and "db_password" not in seen
    env, withheld = command_env({"PATH": "/bin", "X_TOKEN": "t", "X_key": "k"}, ["X_TOKEN"])
    assert env == {"PATH": "/bin", "X_TOKEN": "t"} and withheld == ["X_key"]


def test_the_approval_names_the_withheld_variables_never_their_values(tmp_path, environ):
    tool = CommandTool(Workspace(tmp_path, pass_env=("GITHUB_TOKEN",))).tool()
    assert tool.preview is not None
    shown = tool.preview({"command": "env"})
    n = sum(looks_secret(name) for name in os.environ) - 1  # the machine's own secrets count too; less GITHUB_TOKEN
    assert isinstance(shown, str) and shown.startswith(f"environment: {n} variables withheld from the command (")
    assert "[run_command] pass_env" in shown
    for name, value in SECRETS.items():
        assert (name in shown) is (name != "GITHUB_TOKEN") and value not in shown
    assert ("contain KEY, SECRET, TOKEN, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL, or have a part PASS, PWD or "
            "PAT between underscores, are not set") in tool.tool.description


def test_nothing_withheld_means_no_preview(tmp_path, monkeypatch):
    monkeypatch.setattr("os.environ", {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert CommandTool(Workspace(tmp_path)).tool().preview({"command": "true"}) is None


def test_the_agents_file_reads_pass_env_and_it_is_no_role(tmp_path):
    path = tmp_path / "agents.toml"
    path.write_text(textwrap.dedent("""
        [run_command]
        pass_env = ["GITHUB_TOKEN", "AWS_*"]

        [editor]
        system = "edit"
    """))
    assert load_agent_config(path).pass_env == ("GITHUB_TOKEN", "AWS_*")
    assert list(load_agents(path)) == ["editor"]
    assert load_agent_config(None).pass_env == ()
    for bad in ('pass_env = "GITHUB_TOKEN"', "pass_env = [1]", 'pass = ["X"]'):
        path.write_text(f"[run_command]\n{bad}\n")
        with pytest.raises(AgentFileError, match=r"\[run_command\]"):
            load_agent_config(path)


async def test_run_withholds_secrets_and_passes_what_the_agents_file_names(tmp_path, environ):
    path = tmp_path / "agents.toml"
    path.write_text('[run_command]\npass_env = ["GITHUB_TOKEN"]\n')

    def script(prompt):
        return "done" if last_user(prompt).startswith("<tool_response>") else call("run_command", command="env")

    out, approval = io.StringIO(), FixedApproval(ALLOW_ONCE)
    async with scripted_engine(script) as (runner, _, _):
        code = await run_task(RunOptions("show env", tmp_path, json_out=True), runner, roles={},
                              file_config=load_agent_config(path), approval=approval, out=out, err=io.StringIO())
    assert code == 0
    result = [m for m in json.loads(out.getvalue())["messages"] if m["role"] == "tool"][0]["content"]
    assert "GITHUB_TOKEN=ghp-token-value" in result and "LANG=C.UTF-8" in result
    assert not any(value in result for name, value in SECRETS.items() if name != "GITHUB_TOKEN")
    assert "OPENAI_API_KEY" in approval.asked[0].preview and "GITHUB_TOKEN" not in approval.asked[0].preview


async def test_a_panes_agent_gets_the_agents_files_pass_env(tmp_path, environ):
    from magnitude_tui.agents import RoleBook
    from tests.agent_app_support import ToolClient, agent_app, drive, tool_results
    from tests.app_support import type_message

    (tmp_path / "work").mkdir()
    path = tmp_path / "agents.toml"
    path.write_text('[runner]\nsystem = "You run."\ntools = ["run_command"]\napprove = "auto"\n\n'
                    '[run_command]\npass_env = ["GITHUB_TOKEN"]\n')

    def script(request):
        results = tool_results(request)
        return "saw " + results[0] if results else [("run_command", {"command": "env"})]

    client = ToolClient(script)
    async with agent_app(tmp_path, client, roles=RoleBook(path)) as (app, pilot):
        await type_message(pilot, "/agent runner show env")
        pane = app.workspace.grid.panes[0]
        await drive(pilot, client, lambda: "saw" in (pane.last_answer() or "")
                    and not app.workspace.agents.running(pane), "the answer", on_dialog=lambda: None)
        answer = pane.last_answer()
    assert "GITHUB_TOKEN=ghp-token-value" in answer and "EDITOR=vi" in answer
    assert "sk-openai-value" not in answer and "OPENAI_API_KEY" not in answer
