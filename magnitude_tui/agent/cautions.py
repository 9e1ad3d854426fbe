"""Provides write_caution: why a write is asked about every time, even with its tool allowed for the pane (a file git acts on, a file with other hard links)."""

from __future__ import annotations

import stat
from pathlib import Path

from magnitude_tui.agent.workspace import OutsideRoot, Workspace


def write_caution(ws: Workspace, args: dict) -> str | None:
    """Why this write is asked about every time, even with its tool allowed for the pane: a
    file git acts on (in .git, or in any directory git would take for a repository: hooks it
    runs, a config whose core.fsmonitor or core.hooksPath names a program), so allowing
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
