"""`generate --json-schema FILE`, `--tools FILE` and `--tool-choice`: checked as `serve` checks a body,
the calls printed (fake backend), and schema-valid replies from the real model."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from backend.factory import BackendConfig
from backend.tools import ToolSyntax, call_text
from magnitude_tui.cli import app
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.generate import ToolFileError, run_generate, tool_use_from_files
from scheduler.types import ToolChoiceMode

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20}, "age": {"type": "integer"}}}


def _file(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_files_are_checked_as_serve_checks_a_body(tmp_path):
    use = tool_use_from_files(tools=_file(tmp_path, "t.json", TOOLS), tool_choice="get_weather")
    assert use.tools[0].name == "get_weather" and use.tool_choice.mode is ToolChoiceMode.FUNCTION
    assert json.loads(tool_use_from_files(json_schema=_file(tmp_path, "s.json", SCHEMA)).response_schema) == SCHEMA
    with pytest.raises(ToolFileError, match=r"s2.json: 'response_format.json_schema.schema' is not a valid JSON schema"):
        tool_use_from_files(json_schema=_file(tmp_path, "s2.json", {"type": "objekt"}))
    with pytest.raises(ToolFileError, match=r"t2.json: 'tools' must be an array"):
        tool_use_from_files(tools=_file(tmp_path, "t2.json", {"name": "x"}))
    with pytest.raises(ToolFileError, match=r"'tool_choice' names 'nope', which is not among 'tools'"):
        tool_use_from_files(tools=_file(tmp_path, "t.json", TOOLS), tool_choice="nope")
    with pytest.raises(ToolFileError, match=r"bad.json: not a readable JSON file"):
        tool_use_from_files(tools=_file(tmp_path, "bad.json", "{nope"))


def test_a_bad_file_ends_the_command_with_one_line(tmp_path):
    out = CliRunner().invoke(app, ["generate", "hi", "--tools", _file(tmp_path, "t.json", [{"type": "x"}])])
    assert out.exit_code == 2
    assert "magnitude-tui: " in out.output and "'tools[0]' must be" in out.output and "Traceback" not in out.output


def _scripted(reply: str) -> WorkerClient:
    return WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16, reply=reply), policy="fixed:64"),
                        in_process=True)


def test_the_parsed_calls_are_printed_and_in_the_json(tmp_path, capsys):
    use = tool_use_from_files(tools=_file(tmp_path, "t.json", TOOLS), tool_choice="required")
    reply = call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Oslo"}')
    code = run_generate(["Weather in Oslo?"] * 2, _scripted(reply), max_tokens=200, temperature=0.0, seed=1,
                        stream=False, json_out=True, tool_use=use)
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    for s in doc["sequences"]:
        (call,) = s["tool_calls"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"}
        assert call["id"] and s["text"] == ""
    code = run_generate(["Weather in Oslo?"], _scripted(reply), max_tokens=200, temperature=0.0, seed=1,
                        stream=False, tool_use=use)
    out = capsys.readouterr().out
    assert code == 0 and '#0 tool call get_weather({"city": "Oslo"})' in out


@pytest.mark.slow
def test_json_schema_replies_from_the_real_model_validate(tmp_path):
    schema = _file(tmp_path, "person.json", SCHEMA)
    out = CliRunner().invoke(app, ["generate", "--prompts", _file(tmp_path, "p.txt", "Invent a person.\n"
                                   "Describe a sailor.\nName a baker and give her age.\n"),
                                   "--json-schema", schema, "--json", "--max-tokens", "48", "--device", "cpu",
                                   "--threads", "1"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout[out.stdout.index("{"):])
    assert len(doc["sequences"]) == 3
    for s in doc["sequences"]:
        assert s["done_reason"] == "stop", s
        Draft202012Validator(SCHEMA).validate(json.loads(s["text"]))
