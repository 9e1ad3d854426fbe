"""Provides write_caution: why a write is asked about every time, even with its tool allowed for the pane (a file git acts on, a git config file the repository includes, a hook directory core.hooksPath names, a file with other hard links)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from magnitude_tui.agent.workspace import OutsideRoot, Workspace


def write_caution(ws: Workspace, args: dict) -> str | None:
    """Why this write is asked about every time, even with its tool allowed for the pane: a
    file git acts on (in .git, or in any directory git would take for a repository: hooks it
    runs, a config whose core.fsmonitor or core.hooksPath names a program, or a config file of the
    work tree that the repository's config includes), so allowing
    writes does not allow running programs, and no `git diff` would show the change; or a file
    with other hard links, which changes under every name, inside the workspace or not.
    None for an ordinary file (or a path the preview refuses)."""
    try:
        path = ws.resolve(args["path"])
    except (OutsideRoot, KeyError, TypeError):
        return None
    rel = ws.relative(path)
    for parent in [path, *path.parents]:  # above the root too: a workspace inside .git/hooks
        if parent.name.casefold() == ".git" or _looks_like_git_dir(parent):
            where = ws.relative(parent) if parent == ws.root or ws.root in parent.parents \
                else str(parent)
            return (f"{rel} is in a git directory ({where}): git runs hooks, and programs its config "
                    "names, from there, so this write could run programs; git diff does not show it")
    included = _included_config(path)
    if included is not None:
        file, by = included
        return (f"{rel} is a git config file the repository reads ({by} includes {file.name}): git runs "
                "programs its settings name (core.fsmonitor, core.hooksPath, aliases), so this write could "
                "run programs")
    hooks = _hooks_dir_holding(path)
    if hooks is not None:
        hooks_dir, config = hooks
        where = ws.relative(hooks_dir) if hooks_dir == ws.root or ws.root in hooks_dir.parents else str(hooks_dir)
        return (f"{rel} is in the directory git runs hooks from ({where}, core.hooksPath in {config}): "
                "git runs the programs there at the next commit, checkout or merge, so this write could "
                "run programs")
    try:
        st = path.stat()
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return (f"{rel} has {st.st_nlink} hard links: the change shows under its other names too, which "
                "may be outside the workspace")
    return None


def _looks_like_git_dir(path: Path) -> bool:
    """A repository's git directory under another name (a bare repository, `foo.git`): git takes a
    directory with HEAD, objects/ and refs/ for one."""
    try:
        return (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir()
    except OSError:
        return False


# Git's configuration files can include others; deeper than this is not followed (git stops at 10).
_MAX_INCLUDE_DEPTH = 10


def _hooks_dir_holding(path: Path) -> tuple[Path, str] | None:
    """(the hook directory, the config file naming it) when `path` is in a directory that
    core.hooksPath names for a repository whose work tree holds `path`; None otherwise. Read from
    the files git reads (the system, global and XDG configs, the repository's config and
    config.worktree, and what they include), never by running git: every value any of them
    gives counts, not only the one git would use, and includes are followed whatever their
    condition (includeIf), so a write is cautioned wherever it could be a hook. A relative value is
    relative to the work tree's root; a directory named `_` (husky 9) also covers the directory
    above it, whose scripts the hooks there run."""
    for tree in path.parents:
        git_dir = _git_dir_of(tree)
        if git_dir is None:
            continue
        for value, config in _read_configs(git_dir)[0]:
            raw = Path(os.path.expanduser(value)) if value.startswith("~") else Path(value)
            hooks = (raw if raw.is_absolute() else tree / raw)
            try:
                hooks = hooks.resolve()
            except (RuntimeError, OSError):
                continue
            for covered in ([hooks, hooks.parent] if hooks.name == "_" else [hooks]):
                if covered in path.parents:
                    return covered, config
    return None


def _git_dir_of(tree: Path) -> Path | None:
    """The git directory of a work tree whose root is `tree` (its `.git` directory, or the one a
    `.git` file names: a linked worktree, a submodule); None when `tree` is no work tree's root."""
    dot_git = tree / ".git"
    try:
        if dot_git.is_dir():
            return dot_git
        if not dot_git.is_file():
            return None
        text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:"):].strip())
    return target if target.is_absolute() else tree / target


def _config_files(git_dir: Path) -> list[Path]:
    """The files git reads its configuration from for this repository, in git's order."""
    home = Path.home()
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path(os.environ.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"),
             xdg / "git" / "config", Path(os.environ.get("GIT_CONFIG_GLOBAL") or home / ".gitconfig")]
    common = git_dir
    try:
        named = (git_dir / "commondir").read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        named = ""
    if named:  # a linked worktree: the repository's config is in the main git directory
        common = Path(os.path.normpath(named if Path(named).is_absolute() else git_dir / named))
    files += [common / "config", git_dir / "config.worktree"]
    if common != git_dir:
        files.append(common / "config.worktree")
    return files


def _included_config(path: Path) -> tuple[Path, str] | None:
    """(the file, the config including it) when `path` is a file that the configuration of a
    repository whose work tree holds it includes (include.path, includeIf): a config shipped in
    the work tree (`.gitconfig-shared`) is read as the repository's own, core.fsmonitor and all."""
    for tree in path.parents:
        git_dir = _git_dir_of(tree)
        if git_dir is None:
            continue
        for file, by in _read_configs(git_dir)[1]:
            try:
                if file.resolve() == path:
                    return file, by
            except (RuntimeError, OSError):
                continue
    return None


def _read_configs(git_dir: Path) -> tuple[list[tuple[str, str]], list[tuple[Path, str]]]:
    """Every core.hooksPath value the repository's config files give, with the file it is in; and
    every file they include, with the file including it."""
    found: list[tuple[str, str]] = []
    included: list[tuple[Path, str]] = []
    for file in _config_files(git_dir):
        _read_config(file, found, included, 0)
    return found, included


def _read_config(file: Path, found: list[tuple[str, str]], included: list[tuple[Path, str]], depth: int) -> None:
    try:
        text = file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return
    for section, key, value in _config_entries(text):
        if section == "core" and key == "hookspath" and value:
            found.append((value, str(file)))
        elif (section == "include" or section.startswith("includeif")) and key == "path" and value \
                and depth < _MAX_INCLUDE_DEPTH:
            named = Path(os.path.expanduser(value))
            target = named if named.is_absolute() else file.parent / named
            included.append((target, str(file)))
            _read_config(target, found, included, depth + 1)


def _config_entries(text: str):
    """(section, key, value) of a git config file, section and key lower-cased (a subsection kept
    after a space, as `includeif "gitdir:~/x/"`); quotes, escapes, comments and continued lines as
    git reads them. A key without `=` is true, as in git."""
    section = ""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.startswith("["):
            end = line.find("]")
            if end < 0:
                continue
            head = line[1:end].strip()
            name, _, sub = head.partition(" ")
            if "." in name and not sub:  # the old [section.subsection] form
                name, _, sub = name.partition(".")
            section = name.lower() + (" " + sub.strip() if sub else "")
            line = line[end + 1:].strip()  # `[core] hooksPath = x` on one line
            if not line:
                continue
        if not line or line[0] in "#;":
            continue
        key, eq, rest = line.partition("=")
        key = key.strip().lower()
        if not eq:
            yield section, key, "true"
            continue
        value, quoted, out = rest, False, []
        while True:
            j = 0
            continued = False
            while j < len(value):
                c = value[j]
                if c == "\\" and j + 1 < len(value):
                    out.append({"n": "\n", "t": "\t", "b": "\b"}.get(value[j + 1], value[j + 1]))
                    j += 2
                    continue
                if c == "\\":  # a backslash ending the line: the value goes on
                    continued = True
                    break
                if c == '"':
                    quoted = not quoted
                elif c in "#;" and not quoted:
                    break
                else:
                    out.append(c)
                j += 1
            if continued and i < len(lines):
                value = lines[i]
                i += 1
                continue
            break
        yield section, key, "".join(out).strip()
