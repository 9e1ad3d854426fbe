"""The built-in file tools: reading, searching under .gitignore, edits as diffs, and every way out of the root refused (run_command: tests/test_agent_command.py)."""

from __future__ import annotations

import asyncio
import errno
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from magnitude_tui.agent.fs_tools import FileTools
from magnitude_tui.agent.toolbox import ToolResult
from magnitude_tui.agent.workspace import Limits, Workspace


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("def main():\n    return 41\n")
    (root / "notes.txt").write_text("one\ntwo\nthree\nfour\n")
    (root / ".gitignore").write_text("build/\n*.log\n")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("return 41 in build\n")
    (root / "debug.log").write_text("return 41 in a log\n")
    (tmp_path / "secret.txt").write_text("the secret outside\n")
    return Workspace(root, Limits(command_timeout_s=5.0, output_chars=200))


def tools(ws):
    return {t.name: t for t in FileTools(ws).tools()}


def run(ws, name, **args):
    return asyncio.run(tools(ws)[name].run(args))


def test_read_file_whole_and_a_line_range(ws):
    r = run(ws, "read_file", path="notes.txt")
    assert r.ok and "one\ntwo\nthree\nfour" in r.text and "lines 1-4 of 4" in r.text
    r = run(ws, "read_file", path="notes.txt", start_line=2, end_line=3)
    assert r.ok and r.text.endswith("two\nthree\n") and "one" not in r.text


def test_read_file_is_capped(ws):
    (ws.root / "big.txt").write_text("x" * 100 + "\n" + "y" * 100_000)
    r = run(ws, "read_file", path="big.txt")
    assert r.ok and len(r.text) < ws.limits.read_chars + 200 and "cut at" in r.text


def test_read_file_streams_a_huge_file_holding_only_the_lines_shown(ws):
    line = "x" * 99 + "\n"
    with open(ws.root / "huge.log", "w") as f:
        f.writelines(line for _ in range(300_000))  # 30 MB
    tracemalloc.start()
    try:
        r = FileTools(ws).read_file({"path": "huge.log", "start_line": 299_999})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.ok and r.text == f"huge.log (lines 299999-300000 of 300000):\n{line}{line}", r.text[:200]
    assert peak < 2_000_000, peak  # the whole file read and split held over 60 MB


def test_read_file_holds_only_what_it_shows_of_a_huge_line_and_says_how_to_see_the_rest(ws):
    # A 30 MB line (a minified bundle, a one-line JSON dump) was read and decoded whole to show
    # its first 64,000 characters, and the result said "read a smaller range", which for one
    # line cannot help: the model asked for line 1 again and got the same.
    with open(ws.root / "bundle.min.js", "w") as f:
        f.write("x" * 30_000_000 + "\nsecond line\n")
    tracemalloc.start()
    try:
        r = FileTools(ws).read_file({"path": "bundle.min.js"})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.ok and r.text.startswith("bundle.min.js (lines 1-1 of 2):\nxxx"), r.text[:100]
    assert "line 1 alone is 30,000,001 bytes long" in r.text and "tail -c +64001 | head -c 64000" in r.text
    assert "smaller range" not in r.text and len(r.text) < ws.limits.read_chars + 300
    assert peak < 2_000_000, peak
    # Cut across lines: the header names the lines shown, and the note where to read on.
    (ws.root / "many.txt").write_text(("a" * 999 + "\n") * 200)
    r = run(ws, "read_file", path="many.txt")
    assert r.text.startswith("many.txt (lines 1-64 of 200):") and r.text.endswith("read on with start_line=65]")


def test_odd_paths_get_errors_that_say_what_the_path_is_and_what_to_do(ws, monkeypatch):
    # They read "src is not a file" for a directory and a missing file alike, "it is a binary
    # file" without naming it, and an unreadable file as "[Errno 13] Permission denied:
    # '/abs/path'"; a small model then retried the same call.
    os.mkfifo(ws.root / "events.fifo")
    (ws.root / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (ws.root / "locked.txt").write_text("private\n")
    expected = [
        ("read_file", {"path": "src"}, "error: src is a directory; list it with list_dir"),
        ("read_file", {"path": "nope.txt"}, "error: nope.txt does not exist"),
        ("read_file", {"path": "events.fifo"}, "error: events.fifo is a named pipe, not a regular file"),
        ("read_file", {"path": "blob.bin"}, "error: blob.bin is a binary file"),
        ("read_file", {"path": "bad\ufffdname.txt"}, "is not UTF-8 on disk and cannot be named here"),
        ("list_dir", {"path": "notes.txt"}, "error: notes.txt is not a directory; read it with read_file"),
        ("list_dir", {"path": "nope"}, "error: nope does not exist"),
        ("edit_file", {"path": "nope.txt", "old_text": "a", "new_text": "b"},
         "error: nope.txt does not exist; create it with write_file"),
        ("edit_file", {"path": "src", "old_text": "a", "new_text": "b"}, "error: src is a directory"),
        ("write_file", {"path": "src", "content": "x"}, "error: src is a directory"),
        ("write_file", {"path": "blob.bin", "content": "x"}, "error: blob.bin is a binary file"),
    ]
    for name, args, start in expected:
        r = run(ws, name, **args)
        assert not r.ok and (r.text.startswith(start) or start in r.text), (name, args, r.text)
    # Root reads every file whatever its mode, so the refusal is the OS's, as a user would meet it.
    real_open = Path.open

    def no_read(self, *a, **kw):
        if self.name == "locked.txt":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *a, **kw)

    monkeypatch.setattr(Path, "open", no_read)
    r = run(ws, "read_file", path="locked.txt")
    assert not r.ok and r.text == "error: locked.txt: Permission denied"
    assert str(ws.root) not in r.text


def test_impossible_ranges_and_writes_are_said_before_anyone_is_asked(ws):
    # write_file under a file ("notes.txt/x") was shown for approval and failed only once
    # allowed ("[Errno 20] Not a directory"); a range given backwards read "lines 5-4 do not
    # exist" for a 4-line file; an empty file read "(lines 1-0 of 0)".
    file_tools = FileTools(ws)
    preview = file_tools.write_preview({"path": "notes.txt/deeper/x.md", "content": "x"})
    assert isinstance(preview, ToolResult) and not preview.ok
    assert preview.text == "error: notes.txt is a file, so notes.txt/deeper/x.md cannot be made under it"
    assert isinstance(file_tools.write_preview({"path": "src/new/x.md", "content": "x"}), str)  # dirs to be made
    assert run(ws, "read_file", path="notes.txt", start_line=5, end_line=2).text == \
        "error: end_line 2 is before start_line 5"
    assert run(ws, "read_file", path="notes.txt", start_line=5).text == \
        "error: notes.txt has 4 lines; line 5 and on do not exist"
    (ws.root / "empty.txt").write_text("")
    assert run(ws, "read_file", path="empty.txt").text == "empty.txt is empty (0 lines)"


def test_list_dir_marks_directories(ws):
    r = run(ws, "list_dir", path=".")
    assert r.ok and "src/" in r.text.splitlines() and "notes.txt" in r.text.splitlines()


def test_search_honours_gitignore_and_globs(ws):
    r = run(ws, "search", pattern=r"return \d+")
    assert r.ok and "src/app.py:2:" in r.text
    assert "build/" not in r.text and "debug.log" not in r.text  # both ignored by .gitignore
    assert run(ws, "search", pattern="return", glob="*.txt").text.startswith("no match")
    assert "src/app.py" in run(ws, "search", pattern="return", glob="src/**/*.py").text


def test_search_and_read_file_number_lines_as_grep_does(ws):
    # A form feed (Python and C sources have them) is not a line break for grep or an editor.
    (ws.root / "paged.py").write_bytes(b"a = 1\r\n\x0c\nb = 2  # target\n")
    r = run(ws, "search", pattern="target")
    assert r.ok and r.text == "paged.py:3: b = 2  # target", r.text
    assert run(ws, "read_file", path="paged.py", start_line=3).text.endswith("\nb = 2  # target\n")


def test_search_reports_a_bad_pattern_as_its_result(ws):
    r = run(ws, "search", pattern="(")
    assert not r.ok and "not a regular expression" in r.text


@pytest.mark.serial
def test_a_search_that_backtracks_without_end_fails_alone_and_leaves_the_loop_free(tmp_path):
    # (a|aa)+$ on 40 a's and a b takes longer than anyone waits; with `re` it also held the GIL,
    # so the app froze until it ended.
    root = tmp_path / "r"
    root.mkdir()
    (root / "aaa.txt").write_text("fine aa\n" + "a" * 40 + "b\n")
    ws = Workspace(root, Limits(search_seconds=0.5))

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        ticker = asyncio.create_task(tick())
        t0 = time.monotonic()
        result = await tools(ws)["search"].run({"pattern": "(a|aa)+$"})
        took = time.monotonic() - t0
        ticker.cancel()
        return result, took, ticks

    r, took, ticks = asyncio.run(main())
    assert r.ok and r.text.startswith("aaa.txt:1: fine aa\n[matching") and "ran past 0.5 s" in r.text, r.text
    assert "(at aaa.txt:2)" in r.text  # the match found before stands; the stuck line is named
    assert took < 5.0, took
    assert ticks >= took / 0.02 / 3, (ticks, took)  # the event loop kept running meanwhile
    assert run(ws, "search", pattern="fine").text == "aaa.txt:1: fine aa"
    alone = Workspace(root, Limits(search_seconds=0.5))
    (root / "aaa.txt").write_text("a" * 40 + "b\n")
    r = run(alone, "search", pattern="(a|aa)+$")
    assert not r.ok and r.text.startswith("error: matching '(a|aa)+$' ran past 0.5 s (at aaa.txt:1)"), r.text


def test_the_search_deadline_counts_matching_not_walking_a_big_tree(tmp_path, monkeypatch):
    # A slow file system (1 ms a file, 0.6 s in all) against a 0.3 s deadline for matching.
    import magnitude_tui.agent.fs_tools as fs_tools

    root = tmp_path / "r"
    root.mkdir()
    for i in range(600):
        (root / f"f{i:04}.txt").write_text("x\ny\n" + ("needle\n" if i % 10 == 0 else ""))
    real = fs_tools._read_text

    def slow(path, **kw):
        time.sleep(0.001)
        return real(path, **kw)

    monkeypatch.setattr(fs_tools, "_read_text", slow)
    r = run(Workspace(root, Limits(search_seconds=0.3)), "search", pattern="needle")
    assert r.ok and len(r.text.splitlines()) == 60 and "ran past" not in r.text, r.text[-300:]


def test_edit_file_replaces_one_exact_occurrence_and_returns_the_diff(ws):
    r = run(ws, "edit_file", path="src/app.py", old_text="return 41", new_text="return 42")
    assert r.ok and "-    return 41" in r.diff and "+    return 42" in r.diff
    assert (ws.root / "src" / "app.py").read_text() == "def main():\n    return 42\n"
    missing = run(ws, "edit_file", path="src/app.py", old_text="return 41", new_text="x")
    assert not missing.ok and "not found" in missing.text


def test_edit_preview_shows_the_diff_without_writing(ws):
    tool = tools(ws)["edit_file"]
    preview = tool.preview({"path": "notes.txt", "old_text": "two", "new_text": "2"})
    assert isinstance(preview, str) and "+2" in preview
    assert (ws.root / "notes.txt").read_text().startswith("one\ntwo")


def test_an_edit_that_fails_mid_write_leaves_the_old_file_whole(ws, monkeypatch):
    """Written in place, a full disk or a kill mid-write left the file emptied or cut; now the new
    text goes to a file beside it that is renamed over the old one only once it is on disk."""
    target = ws.root / "src" / "app.py"
    before = target.read_text()

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    r = run(ws, "edit_file", path="src/app.py", old_text="return 41", new_text="return 42")
    assert not r.ok and "No space left" in r.text
    assert target.read_text() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["app.py"]  # no temporary file left


def test_a_file_whose_name_leaves_no_room_for_a_temporary_one_is_still_edited(ws):
    name = "n" * 250  # the temporary name beside it would pass the 255-byte limit
    (ws.root / name).write_text("alpha\n")
    r = run(ws, "edit_file", path=name, old_text="alpha", new_text="beta")
    assert r.ok and (ws.root / name).read_text() == "beta\n"


def test_an_edit_keeps_the_files_mode_and_its_hard_links(ws):
    script = ws.root / "run.sh"
    script.write_text("echo one\n")
    script.chmod(0o750)
    assert run(ws, "edit_file", path="run.sh", old_text="one", new_text="two").ok
    assert script.read_text() == "echo two\n" and (script.stat().st_mode & 0o777) == 0o750
    twin = ws.root / "twin.sh"
    os.link(script, twin)
    assert run(ws, "write_file", path="run.sh", content="echo three\n").ok
    assert twin.read_text() == "echo three\n" and script.stat().st_ino == twin.stat().st_ino


def test_edit_file_refuses_a_file_that_is_not_utf8_and_leaves_its_bytes(ws):
    latin1 = "caf\xe9\nversion = 1\n".encode("latin-1")
    (ws.root / "legacy.txt").write_bytes(latin1)
    edit = tools(ws)["edit_file"]
    args = {"path": "legacy.txt", "old_text": "version = 1", "new_text": "version = 2"}
    preview = edit.preview(args)
    assert not isinstance(preview, str) and "not UTF-8" in preview.text  # refused before anyone is asked
    r = run(ws, "edit_file", **args)
    assert not r.ok and "not UTF-8" in r.text and "write_file" in r.text
    assert (ws.root / "legacy.txt").read_bytes() == latin1  # the \xe9 was not turned into U+FFFD


@pytest.mark.timeout(20)
def test_a_named_pipe_is_skipped_by_search_and_refused_by_write_file(ws):
    os.mkfifo(ws.root / "events.fifo")  # opening it to read would wait for a writer forever
    r = run(ws, "search", pattern=r"return \d+")
    assert r.ok and "src/app.py:2:" in r.text
    r = run(ws, "write_file", path="events.fifo", content="x")
    assert not r.ok and "not a regular file" in r.text
    assert not run(ws, "read_file", path="events.fifo").ok


def test_write_file_creates_and_diffs(ws):
    r = run(ws, "write_file", path="docs/new.md", content="# hi\n")
    assert r.ok and "--- /dev/null" in r.diff and "+# hi" in r.diff
    assert (ws.root / "docs" / "new.md").read_text() == "# hi\n"


# ---- every escape route out of the root ----------------------------------------------------------

ESCAPES = ["../secret.txt", "src/../../secret.txt", "/etc/passwd", "~/x", "src/\0x"]


@pytest.mark.parametrize("path", ESCAPES)
@pytest.mark.parametrize("tool", ["read_file", "list_dir", "edit_file", "write_file"])
def test_paths_outside_the_root_are_refused_as_the_result(ws, tool, path):
    args = {"path": path, "old_text": "the", "new_text": "x", "content": "x"}
    spec = [t for t in FileTools(ws).tools() if t.name == tool][0]
    needed = {k: v for k, v in args.items() if f'"{k}"' in spec.tool.parameters}
    r = asyncio.run(spec.run(needed))
    assert not r.ok and r.text.startswith("refused:"), r.text
    assert (ws.root.parent / "secret.txt").read_text() == "the secret outside\n"


@pytest.fixture
def linked(ws):
    (ws.root / "out").symlink_to(ws.root.parent, target_is_directory=True)
    (ws.root / "leak.txt").symlink_to(ws.root.parent / "secret.txt")
    return ws


@pytest.mark.parametrize("path", ["out/secret.txt", "leak.txt", "out", "out/new.txt"])
def test_symlinks_out_of_the_root_are_refused(linked, path):
    for tool, args in [("read_file", {}), ("list_dir", {}), ("write_file", {"content": "x"}),
                       ("edit_file", {"old_text": "the", "new_text": "x"})]:
        r = run(linked, tool, path=path, **args)
        assert not r.ok and r.text.startswith("refused:"), (tool, r.text)
    assert (linked.root.parent / "secret.txt").read_text() == "the secret outside\n"
    assert not (linked.root.parent / "new.txt").exists()


def test_search_never_leaves_the_root(linked):
    r = run(linked, "search", pattern="secret")
    assert "the secret outside" not in r.text and r.text.startswith("no match")  # links out are not followed
    for glob in ["../*.txt", "/etc/*", "src/../../*", "~/*"]:
        r = run(linked, "search", pattern="secret", glob=glob)
        assert not r.ok and r.text.startswith("refused:"), glob


def test_edit_preview_refuses_before_anyone_is_asked(linked):
    edit = tools(linked)["edit_file"]
    r = edit.preview({"path": "leak.txt", "old_text": "the", "new_text": "x"})
    assert not isinstance(r, str) and r.text.startswith("refused:")


def test_the_command_for_the_rest_of_a_long_line_goes_on_where_the_shown_text_ends(ws):
    # It said `cut -c`, which GNU cut counts in bytes: on a line of two-byte characters it showed
    # again characters the model had already read (and could split one).
    import re
    import subprocess

    text = "".join(chr(0xE9 + i % 20) for i in range(100_000))  # é and on: two bytes each in UTF-8
    (ws.root / "wide.txt").write_text(text + "\n", encoding="utf-8")
    r = FileTools(ws).read_file({"path": "wide.txt"})
    shown = r.text.split("\n", 1)[1].split("\n[cut at", 1)[0]
    command = re.search(r"e\.g\. (sed .*)\]$", r.text).group(1)
    rest = subprocess.run(command, shell=True, cwd=ws.root, capture_output=True, check=True).stdout
    assert text.startswith(shown) and rest.decode("utf-8").startswith(text[len(shown):len(shown) + 1000])
