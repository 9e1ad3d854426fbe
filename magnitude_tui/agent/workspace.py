"""Provides Workspace: the root an agent's tools are confined to, with the checks that keep every path inside it."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Sequence

import pathspec

# What would break a listing's lines or hide in it: control characters (a newline would forge
# entries) and the Unicode line and paragraph separators.
_ODD = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown_name(name: str) -> str:
    """A file name as the tools show it: as it is, or as a JSON string literal when it holds a
    control character or a line break (`"a\\nb"`), or starts with `"` (so no plain name reads as an
    escaped one). `resolve` takes the literal back."""
    if not (_ODD.search(name) or name.startswith('"')):
        return name
    return _ODD.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(name, ensure_ascii=False))


def shown_path(rel: str) -> str:
    """A relative POSIX path with each name as `shown_name` shows it."""
    return "/".join(shown_name(part) for part in rel.split("/"))


def _literal(text: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def unquote_path(path: str) -> str:
    """A path as a model writes it back from a listing: a name shown as a JSON string literal
    (`sub/"a\\nb"`, or the whole path as one) is that name."""
    if '"' not in path:
        return path
    whole = _literal(path) if path.startswith('"') else None
    if whole is not None:
        return whole
    parts = [(_literal(part) if part.startswith('"') else None) for part in path.split("/")]
    return "/".join(part if value is None else value for part, value in zip(path.split("/"), parts))


class OutsideRoot(ValueError):
    """A path that leads out of the workspace root; the message is the model's tool result."""


@dataclass(frozen=True)
class Limits:
    """Caps that keep one tool result from flooding a context (chars are what the model reads)."""

    read_chars: int = 64_000  # read_file: the most text one call returns
    read_lines: int = 2_000
    list_entries: int = 500
    search_matches: int = 200
    search_file_bytes: int = 2_000_000  # larger files are skipped by search
    search_seconds: float = 10.0  # one search's matching, all files together
    output_chars: int = 32_000  # run_command: stdout and stderr together
    command_timeout_s: float = 60.0


class Workspace:
    """The directory tools act in. Every path a model names goes through `resolve` first."""

    def __init__(self, root: str | os.PathLike, limits: Limits = Limits(), pass_env: Sequence[str] = ()) -> None:
        """`pass_env`: variables run_command passes although their names look secret (names, or
        patterns such as AWS_*; the agents file's `[run_command] pass_env`)."""
        self.root = Path(root).resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(f"{root}: the workspace root must be a directory")
        self.limits = limits
        self.pass_env = tuple(pass_env)

    def resolve(self, path: str) -> Path:
        """The real path `path` (relative to the root) names: OutsideRoot when it is absolute,
        climbs above the root with `..`, leads out through a symbolic link (followed as the OS
        would, even for a file that does not exist yet), or through links that loop."""
        if not isinstance(path, str) or "\0" in path:
            raise OutsideRoot(f"{path!r} is not a usable path")
        path = unquote_path(path)
        if "\0" in path:
            raise OutsideRoot(f"{path!r} is not a usable path")
        if path.startswith("~") or os.path.isabs(path) or PurePosixPath(path).is_absolute():
            raise OutsideRoot(f"{path!r} is absolute; give a path relative to the workspace root")
        try:
            real = (self.root / path).resolve(strict=False)
        except (RuntimeError, OSError):  # Python < 3.13 raises RuntimeError for a link loop
            raise OutsideRoot(f"{path!r} cannot be followed: a symbolic link on the way loops") from None
        if real != self.root and self.root not in real.parents:
            raise OutsideRoot(f"{path!r} leads outside the workspace root")
        return real

    def relative(self, real: Path) -> str:
        """`real`'s path from the root as the tools show it (odd names as JSON literals: `shown_name`)."""
        return shown_path(self.relative_raw(real))

    def relative_raw(self, real: Path) -> str:
        """`real`'s path from the root, its names as they are (for glob matching and shell commands)."""
        rel = real.relative_to(self.root).as_posix()
        return rel or "."

    def check_glob(self, pattern: str) -> str:
        """A search glob stays inside the root: relative, no `..` segment."""
        if not isinstance(pattern, str) or "\0" in pattern:
            raise OutsideRoot(f"{pattern!r} is not a usable glob")
        if pattern.startswith(("/", "~", "\\")) or os.path.isabs(pattern):
            raise OutsideRoot(f"glob {pattern!r} is absolute; give one relative to the workspace root")
        if ".." in PurePosixPath(pattern.replace("\\", "/")).parts:
            raise OutsideRoot(f"glob {pattern!r} climbs out of the workspace root")
        return pattern

    def walk_files(self, start: Path):
        """Files under `start` (real paths inside the root), skipping .git and what .gitignore
        files (the root's and nested ones) ignore; symbolic links are never followed out."""
        ignores: list[tuple[Path, pathspec.PathSpec]] = []
        for parent in [start, *start.parents]:  # .gitignore files above `start`, up to the root
            if parent == self.root or self.root in parent.parents:
                self._add_ignore(parent, ignores)
            if parent == self.root:
                break
        for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
            here = Path(dirpath)
            if here != start:
                self._add_ignore(here, ignores)
            dirnames[:] = sorted(d for d in dirnames if d != ".git" and not self._ignored(here / d, True, ignores))
            for name in sorted(filenames):
                path = here / name
                if self._ignored(path, False, ignores):
                    continue
                try:
                    real = path.resolve()
                except (RuntimeError, OSError):  # a link loop (`a -> b -> a`): no file to search
                    continue
                if real != path and (self.root not in real.parents or not real.is_file()):
                    continue  # a link that leads out (or to no file) is not searched
                yield path

    @staticmethod
    def _add_ignore(directory: Path, ignores: list) -> None:
        gi = directory / ".gitignore"
        if gi.is_file():
            try:
                lines = gi.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                return
            ignores.append((directory, pathspec.GitIgnoreSpec.from_lines(lines)))

    @staticmethod
    def _ignored(path: Path, is_dir: bool, ignores: list) -> bool:
        for base, spec in ignores:
            if base == path or base not in path.parents:
                continue
            rel = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            if spec.match_file(rel):
                return True
        return False
