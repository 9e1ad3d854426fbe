"""A hook directory named by core.hooksPath outside .git (husky's `.husky/_`, a `githooks/`) was
not cautioned: with write_file allowed for the pane, a write there went unasked and git ran it
at the next commit. The caution reads the configuration files git reads (never running git)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from magnitude_tui.agent.cautions import write_caution
from magnitude_tui.agent.policy import ALLOW_PANE, FixedApproval
from magnitude_tui.agent.workspace import Workspace
from tests.test_agent_loop import run_agent
from tests.test_tools_probe_consent import writes


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home of the test's own: no global or system git config of the machine counts."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return home


@pytest.fixture
def repo(tmp_path, home):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("VERSION = 1\n")
    return root


def git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def caution(root, path):
    return write_caution(Workspace(root), {"path": path})


def test_a_relative_hooks_path_in_the_repositorys_config_is_cautioned(repo):
    assert caution(repo, "githooks/pre-commit") is None  # no hooksPath yet: an ordinary directory
    git(repo, "config", "core.hooksPath", "githooks")
    said = caution(repo, "githooks/pre-commit")
    assert said is not None and said.startswith("githooks/pre-commit is in the directory git runs hooks from "
                                                "(githooks, core.hooksPath in ")
    assert str(repo / ".git" / "config") in said
    assert caution(repo, "githooks/sub/helper.sh") is not None  # anything under it
    assert caution(repo, "src/app.py") is None and caution(repo, "githooks-notes.txt") is None
    # Still the .git caution for .git itself.
    assert "git directory (.git)" in caution(repo, ".git/hooks/pre-commit")


def test_husky_9s_hook_directory_covers_the_scripts_above_it(repo):
    # husky 9 sets core.hooksPath = .husky/_ whose hooks run .husky/<hook>: both are cautioned.
    git(repo, "config", "core.hooksPath", ".husky/_")
    assert "(.husky/_, core.hooksPath" in caution(repo, ".husky/_/h")
    assert "(.husky, core.hooksPath" in caution(repo, ".husky/pre-commit")


def test_absolute_global_worktree_and_included_configs_count_too(repo, home, tmp_path):
    (home / ".gitconfig").write_text('[core]\n\thooksPath = "hooks-global" ; a comment\n')
    assert "core.hooksPath in " + str(home / ".gitconfig") in caution(repo, "hooks-global/pre-push")
    (home / ".gitconfig").unlink()
    xdg = home / ".config" / "git"
    xdg.mkdir(parents=True)
    (xdg / "config").write_text("[include]\n\tpath = ~/more.inc\n")
    (home / "more.inc").write_text("[core]\nhooksPath = ~/../repo/from-include\n")
    assert str(home / "more.inc") in caution(repo, "from-include/commit-msg")
    (repo / ".git" / "config.worktree").write_text(f"[core]\n\thooksPath = {repo / 'abs-hooks'}\n")
    assert "config.worktree" in caution(repo, "abs-hooks/pre-commit")
    # An includeIf is followed whatever its condition (cautioning more is safe).
    (repo / ".git" / "config").write_text('[includeIf "gitdir:/nowhere/"]\n\tpath = ../cond.inc\n')
    (repo / "cond.inc").write_text("[core]\n\thookspath = cond-hooks\n")
    assert caution(repo, "cond-hooks/pre-commit") is not None


def test_a_linked_worktrees_hooks_path_comes_from_the_main_repository(repo, tmp_path):
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", str(other))
    git(repo, "config", "core.hooksPath", "githooks")
    assert (other / ".git").is_file()
    assert "core.hooksPath in " + str(repo / ".git" / "config") in caution(other, "githooks/pre-commit")


async def test_allowing_write_file_for_the_pane_does_not_allow_writing_a_hook(repo):
    git(repo, "config", "core.hooksPath", ".husky/_")
    approval = FixedApproval(ALLOW_PANE)
    out, _, _ = await run_agent(repo, writes(("src/new.py", "x = 1\n"), (".husky/pre-commit", "#!/bin/sh\nid\n"),
                                             ("src/other.py", "y = 2\n")), approval=approval)
    assert out.ok
    asked = [(json.loads(r.arguments)["path"], r.caution) for r in approval.asked]
    assert [path for path, _ in asked] == ["src/new.py", ".husky/pre-commit"]
    assert asked[0][1] is None and "directory git runs hooks from (.husky" in asked[1][1]


def test_a_config_file_of_the_work_tree_that_the_repository_includes_is_cautioned(repo):
    # A repository may ship its settings as a file of the work tree, enabled once with
    # include.path: git reads it as its own config, so a core.fsmonitor written there runs at the
    # next git status. Writing it was not cautioned (only .git/ and hook directories were).
    (repo / ".gitconfig-shared").write_text("[core]\n\tautocrlf = false\n")
    assert caution(repo, ".gitconfig-shared") is None  # not included yet: an ordinary file
    git(repo, "config", "include.path", "../.gitconfig-shared")
    said = caution(repo, ".gitconfig-shared")
    assert said is not None and said.startswith(".gitconfig-shared is a git config file the repository reads (")
    assert str(repo / ".git" / "config") in said and "core.fsmonitor" in said
    # An include of an include, under includeIf, counts too; other files stay ordinary.
    (repo / "conf").mkdir()
    (repo / "conf" / "more.inc").write_text("[alias]\n\tst = status\n")
    (repo / ".gitconfig-shared").write_text('[includeIf "gitdir:/nowhere/"]\n\tpath = conf/more.inc\n')
    assert caution(repo, "conf/more.inc") is not None
    assert caution(repo, "src/app.py") is None and caution(repo, "conf/other.inc") is None
