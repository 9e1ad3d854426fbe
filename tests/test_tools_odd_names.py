"""File names with a newline or another control character: list_dir, search and the tools'
messages printed them raw, so the model saw a listing it could not parse, and a name such as
"notes.txt\\nsecrets/" forged entries. Such names are shown as JSON string literals, and every
file tool takes that literal back."""

from __future__ import annotations

import asyncio
import json

import pytest

from magnitude_tui.agent.cautions import write_caution
from magnitude_tui.agent.fs_tools import FileTools
from magnitude_tui.agent.workspace import OutsideRoot, Workspace, shown_name, unquote_path

FORGED = "real.txt\nsecret-plans/"  # a file whose name reads as two entries, one a directory


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / FORGED.replace("/", "")).write_text("forged\n")
    (root / "tab\there").mkdir()
    (root / "tab\there" / "bell\a.txt").write_text("rings\n")
    (root / '"quoted"').write_text("a plain name that looks like a literal\n")
    (root / "plain.txt").write_text("plain\n")
    return Workspace(root)


def run(ws, name, **args):
    tools = {t.name: t for t in FileTools(ws).tools()}
    return asyncio.run(tools[name].run(args))


def test_list_dir_shows_odd_names_as_literals_one_entry_a_line(ws):
    r = run(ws, "list_dir")
    assert r.ok
    header, *entries = r.text.split("\n")
    assert header == "./ (4 entries):"
    assert entries == ['"\\"quoted\\""', "plain.txt", '"real.txt\\nsecret-plans"', '"tab\\there"/']
    assert "secret-plans" not in [e.rstrip("/") for e in entries]  # no forged entry
    inner = run(ws, "list_dir", path='"tab\\there"')
    assert inner.text.split("\n") == ['"tab\\there"/ (1 entries):', '"bell\\u0007.txt"']


def test_the_file_tools_take_the_shown_literal_back(ws):
    assert run(ws, "read_file", path='"real.txt\\nsecret-plans"').text.endswith("\nforged\n")
    assert "rings" in run(ws, "read_file", path='"tab\\there"/"bell\\u0007.txt"').text
    assert "rings" in run(ws, "read_file", path='"tab\\there/bell\\u0007.txt"').text  # the whole path as one
    assert "looks like a literal" in run(ws, "read_file", path='"\\"quoted\\""').text
    r = run(ws, "edit_file", path='"tab\\there"/"bell\\u0007.txt"', old_text="rings", new_text="rang")
    assert r.ok and r.text.startswith('edited "tab\\there"/"bell\\u0007.txt":')
    assert (ws.root / "tab\there" / "bell\a.txt").read_text() == "rang\n"
    # The raw name (a JSON "\n" in the call's arguments) still works too.
    assert run(ws, "read_file", path=FORGED.replace("/", "")).ok


def test_search_and_messages_show_odd_names_escaped(ws):
    r = run(ws, "search", pattern="forged|rings")
    assert r.text.split("\n") == ['"real.txt\\nsecret-plans":1: forged', '"tab\\there"/"bell\\u0007.txt":1: rings']
    missing = run(ws, "read_file", path='"gone\\nplain.txt"')
    assert missing.text == 'error: "gone\\nplain.txt" does not exist'
    r = run(ws, "write_file", path='"new\\rfile"', content="x\n")
    assert r.ok and (ws.root / "new\rfile").read_text() == "x\n"
    assert "+++ b/\"new\\rfile\"" in r.diff and "\r" not in r.text


def test_a_literal_cannot_lead_out_or_smuggle_a_nul(ws, tmp_path):
    (tmp_path / "outside.txt").write_text("out\n")
    assert run(ws, "read_file", path='"../outside.txt"').text.startswith("refused:")
    assert run(ws, "read_file", path='".."/"outside.txt"').text.startswith("refused:")
    with pytest.raises(OutsideRoot, match="not a usable path"):
        ws.resolve('"a\\u0000b"')
    # The caution of a write through a literal names the real place.
    (ws.root / ".git").mkdir()
    assert "git directory (.git)" in write_caution(ws, {"path": '".git"/"config"'})


@pytest.mark.parametrize("name", ["a\nb", "\x1b[2Jclear", "line\u2028sep", "del\x7f", "c1\x85", '"x"', "\t"])
def test_every_shown_name_reads_back_as_itself_on_one_line(name):
    shown = shown_name(name)
    assert "\n" not in shown and "\x1b" not in shown and "\u2028" not in shown and "\x85" not in shown
    assert json.loads(shown) == name == unquote_path(shown)


@pytest.mark.parametrize("name", ["plain.txt", "ünïcödé.md", 'mid"quote', "back\\slash", "sp ace"])
def test_ordinary_names_are_shown_as_they_are(name):
    assert shown_name(name) == name == unquote_path(name)
