"""Provides the file tools (read_file, list_dir, search, edit_file, write_file), each confined to a Workspace."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import os
import re
import secrets
import shlex
import stat
import time
from pathlib import Path, PurePosixPath

import regex

from magnitude_tui.agent.cautions import write_caution
from magnitude_tui.agent.policy import ToolKind
from magnitude_tui.agent.toolbox import AgentTool, ToolResult, function_tool
from magnitude_tui.agent.workspace import OutsideRoot, Workspace, shown_name, shown_path

_STR = {"type": "string"}
_SURROGATE = re.compile("[\ud800-\udfff]")  # os.listdir's stand-ins for bytes that are not UTF-8
_PIECE = 1 << 16  # read_file reads a line in pieces of at most this many bytes
_INT = {"type": "integer", "minimum": 1}


def unified_diff(rel: str, old: str | None, new: str) -> str:
    """The change as `git diff` would show it (a new file diffs against /dev/null)."""
    lines = difflib.unified_diff((old or "").splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile="/dev/null" if old is None else f"a/{rel}", tofile=f"b/{rel}")
    out = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return out or f"(no change to {rel})\n"


def _not_a_file(path: Path, rel: str) -> str | None:
    """Why `path` is not a regular file the tools can read, said so the model knows what to do
    instead; None when it is one."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        why = f"{rel} does not exist"
        if "\ufffd" in rel:
            why += (" (a name list_dir shows with \ufffd is not UTF-8 on disk and cannot be named here: use "
                    "run_command with a glob)")
        return why
    except OSError as e:
        return f"{rel}: {e.strerror}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return f"{rel} is a directory; list it with list_dir"
    kind = ("a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"{rel} is {kind}, not a regular file; the file tools read and write regular files only"


def _read_text(path: Path, *, rel: str | None = None, exact: bool = False) -> str:
    """A regular file's text (`rel`: its name in messages). `exact`: it must be UTF-8, since the
    text is written back (an edit), and undecodable bytes read as U+FFFD would be written back changed."""
    rel = rel or path.name
    why = _not_a_file(path, rel)  # a named pipe or a device would block, or never end
    if why is not None:
        raise ValueError(why)
    data = path.read_bytes()
    _refuse_binary(data[:4096], rel)
    if exact:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{rel} is not UTF-8 text (byte {e.start}); edit_file would change its other "
                             "non-UTF-8 bytes too. Use run_command, or write_file to replace it whole") from None
    return data.decode("utf-8", errors="replace")


class FileTools:
    """The file tools of one workspace."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def tools(self) -> list[AgentTool]:
        return [
            AgentTool(function_tool("read_file", "Read a text file of the workspace, optionally a range of lines.",
                                    {"path": _STR, "start_line": _INT, "end_line": _INT}, ["path"]),
                      ToolKind.READ, self._async(self.read_file)),
            AgentTool(function_tool("list_dir", "List a directory of the workspace (directories end with /).",
                                    {"path": _STR}, []),
                      ToolKind.READ, self._async(self.list_dir)),
            AgentTool(function_tool("search", "Search the workspace's files for a regular expression "
                                    "(files .gitignore ignores are skipped); glob narrows the files, e.g. src/**/*.py.",
                                    {"pattern": _STR, "glob": _STR}, ["pattern"]),
                      ToolKind.READ, self._async(self.search)),
            AgentTool(function_tool("edit_file", "Replace one exact occurrence of old_text with new_text in a file.",
                                    {"path": _STR, "old_text": _STR, "new_text": _STR},
                                    ["path", "old_text", "new_text"]),
                      ToolKind.WRITE, self._async(self.edit_file), self.edit_preview, caution=self.write_caution),
            AgentTool(function_tool("write_file", "Write a whole file (created, or replaced).",
                                    {"path": _STR, "content": _STR}, ["path", "content"]),
                      ToolKind.WRITE, self._async(self.write_file), self.write_preview, caution=self.write_caution),
        ]

    def _async(self, fn):
        async def run(args: dict) -> ToolResult:
            # File work off the event loop: a large search must not freeze the panes.
            return await asyncio.to_thread(_guarded, fn, args, self.ws.root)
        return run

    # ---- reading ------------------------------------------------------------------------------

    def read_file(self, args: dict) -> ToolResult:
        path = self.ws.resolve(args["path"])
        rel = self.ws.relative(path)
        why = _not_a_file(path, rel)
        if why is not None:
            return ToolResult.failed(why)
        start = max(1, int(args.get("start_line") or 1))
        want_end = int(args.get("end_line") or 0)  # 0: to the last line
        limits = self.ws.limits
        # Streamed line by line, each line in pieces: only what can be shown is kept (a multi-gigabyte
        # log is counted, never held, and so is a line of hundreds of megabytes, a minified bundle),
        # and lines are what grep and editors count (ended by \n).
        keep_bytes = 4 * limits.read_chars + 4  # a character is at most 4 bytes of UTF-8
        shown: list[str] = []
        lengths: list[int] = []  # each shown line's length in bytes
        chars, total = 0, 0
        with path.open("rb") as f:
            _refuse_binary(f.read(4096), rel)
            f.seek(0)
            while raw := f.readline(_PIECE):
                total += 1
                wanted = start <= total < start + limits.read_lines and (not want_end or total <= want_end) \
                    and chars <= limits.read_chars
                kept, length = raw if wanted else b"", len(raw)
                while not raw.endswith(b"\n") and (raw := f.readline(_PIECE)):
                    length += len(raw)
                    if wanted and len(kept) < keep_bytes:
                        kept += raw
                if wanted:
                    line = kept[:keep_bytes].decode("utf-8", errors="replace")
                    shown.append(line)
                    lengths.append(length)
                    chars += len(line)
        if want_end and want_end < start:
            return ToolResult.failed(f"end_line {want_end} is before start_line {start}")
        end = min(total, want_end or total)
        if start > max(1, total) or end < start and total:
            return ToolResult.failed(f"{rel} has {total} line{'' if total == 1 else 's'}; "
                                     f"line {start} and on do not exist")
        if not total:
            return ToolResult(f"{rel} is empty (0 lines)")
        asked_end, end = end, min(end, start + limits.read_lines - 1)
        body = "".join(shown)
        cut = ""
        if len(body) > limits.read_chars:
            body = body[:limits.read_chars]
            at, before = start, 0  # the line the cut falls in, and the characters before it
            for line in shown:
                if before + len(line) > limits.read_chars:
                    break
                at, before = at + 1, before + len(line)
            end = at if before < limits.read_chars else at - 1  # the last line shown, whole or in part
            if at == start:  # one line longer than a call may show: a smaller range cannot help
                # In bytes: GNU cut -c counts bytes too, and would repeat or split what was shown.
                shown_bytes = len(body.encode("utf-8", "surrogateescape"))
                cut = (f"\n[cut at {limits.read_chars:,} characters ({shown_bytes:,} bytes): line {at} alone is "
                       f"{lengths[0]:,} bytes long; see the rest of it with run_command, e.g. sed -n {at}p "
                       f"{shlex.quote(self.ws.relative_raw(path))} | tail -c +{shown_bytes + 1} | head -c {limits.read_chars}]")
            else:
                cut = (f"\n[cut at {limits.read_chars:,} characters, in line {at}; read on with "
                       f"start_line={at}]")
        elif end < asked_end:
            cut = f"\n[lines {end + 1}-{asked_end} not shown; ask for them with start_line]"
        return ToolResult(f"{rel} (lines {start}-{end} of {total}):\n{body}{cut}")

    def list_dir(self, args: dict) -> ToolResult:
        path = self.ws.resolve(args.get("path") or ".")
        rel = self.ws.relative(path)
        if not path.is_dir():
            why = _not_a_file(path, rel)
            return ToolResult.failed(why if why is not None and " does not exist" in why
                                     else f"{rel} is not a directory" + ("; read it with read_file" if why is None else ""))
        entries = sorted(path.iterdir(), key=lambda p: p.name)
        cap = self.ws.limits.list_entries
        names = [shown_name(p.name) + ("/" if p.is_dir() else "") for p in entries[:cap]]
        more = f"\n[{len(entries) - cap} more not shown]" if len(entries) > cap else ""
        # A name that is not UTF-8 comes as surrogates, which the loop shows as U+FFFD: say so.
        odd = [n for n in names if _SURROGATE.search(n)]
        if odd:
            example = _SURROGATE.sub("?", odd[0].rstrip("/"))
            more += (f"\n[{len(odd)} name(s) here are not UTF-8 (shown with \ufffd); the file tools cannot open "
                     f"them by that name: use run_command with a glob, e.g. ls -l {rel}/{example}]")
        return ToolResult(f"{rel}/ ({len(entries)} entries):\n" + "\n".join(names) + more)

    def search(self, args: dict) -> ToolResult:
        # `regex`, not `re`: its matching can be given a deadline and lets go of the GIL, so a
        # pattern that backtracks without end, `(a+)+$`, fails this call instead of freezing the app.
        try:
            pattern = regex.compile(args["pattern"])
        except regex.error as e:
            return ToolResult.failed(f"pattern {args['pattern']!r} is not a regular expression: {e}")
        glob = self.ws.check_glob(args["glob"]) if args.get("glob") else None
        hits: list[str] = []
        limits = self.ws.limits
        cap, files = limits.search_matches, 0
        left = limits.search_seconds  # matching time only: walking and reading a big tree is not the pattern's
        for path in self.ws.walk_files(self.ws.root):
            rel = self.ws.relative(path)
            if glob is not None and not _glob_match(self.ws.relative_raw(path), glob):
                continue
            try:
                st = path.stat()
                if not stat.S_ISREG(st.st_mode) or st.st_size > limits.search_file_bytes:
                    continue  # a named pipe would block the search
                text = _read_text(path)
            except (OSError, ValueError):
                continue
            files += 1
            for no, line in enumerate(_lines(text), 1):
                t0 = time.monotonic()
                try:
                    found = pattern.search(line, timeout=max(0.0, left))
                except TimeoutError:
                    why = (f"matching {args['pattern']!r} ran past {limits.search_seconds:g} s (at {rel}:{no}); "
                           "a pattern with nested repeats such as (a|aa)+ can take that long on one line: "
                           "simplify it or narrow the glob")
                    if hits:  # what was found stands, with why the search stopped
                        return ToolResult("\n".join(hits) + f"\n[{why}]")
                    return ToolResult.failed(why)
                left -= time.monotonic() - t0
                if found:
                    hits.append(f"{rel}:{no}: {line[:300]}")
                    if len(hits) >= cap:
                        return ToolResult("\n".join(hits) + f"\n[stopped at {cap} matches; narrow the pattern or glob]")
        if not hits:
            return ToolResult(f"no match for {args['pattern']!r} in {files} files")
        return ToolResult("\n".join(hits))

    # ---- writing ------------------------------------------------------------------------------

    def _edited(self, args: dict) -> tuple[Path, str, str | None, str]:
        """(real path, its relative name, old text or None for a new file, new text)."""
        path = self.ws.resolve(args["path"])
        rel = self.ws.relative(path)
        if "content" in args:
            if not path.exists():
                # Its directories are made when it is written: none of them may be a file (the
                # write would fail after someone was asked to allow it).
                parent = path.parent
                while not parent.exists():
                    parent = parent.parent
                if not parent.is_dir():
                    raise ValueError(f"{self.ws.relative(parent)} is a file, so {rel} cannot be made under it")
            return path, rel, _read_text(path, rel=rel) if path.exists() else None, args["content"]
        why = _not_a_file(path, rel)
        if why is not None:
            raise ValueError(why + ("; create it with write_file" if " does not exist" in why else ""))
        old, find, repl = _read_text(path, rel=rel, exact=True), args["old_text"], args["new_text"]
        if not find:
            raise ValueError("old_text is empty; quote the exact text to replace")
        count = old.count(find)
        if count != 1:
            raise ValueError(f"old_text occurs {count} times in {rel}; quote it exactly, with enough "
                             "context to make it unique" if count else f"old_text was not found in {rel}; "
                             "quote it exactly as read_file shows it")
        return path, rel, old, old.replace(find, repl, 1)

    def write_caution(self, args: dict) -> str | None:
        """Why this write is asked about every time (cautions.write_caution); None for an ordinary file."""
        return write_caution(self.ws, args)

    def edit_preview(self, args: dict) -> str | ToolResult:
        return _guarded(lambda a: unified_diff(*self._edited(a)[1:]), args, self.ws.root)

    write_preview = edit_preview

    def edit_file(self, args: dict) -> ToolResult:
        path, rel, old, new = self._edited(args)
        write_whole(path, new)
        diff = unified_diff(rel, old, new)
        return ToolResult(f"edited {rel}:\n{diff}", diff=diff)

    def write_file(self, args: dict) -> ToolResult:
        path, rel, old, new = self._edited(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ws.resolve(self.ws.relative(path.parent))  # mkdir followed no link out (checked again)
        write_whole(path, new)
        diff = unified_diff(rel, old, new)
        return ToolResult(f"{'wrote' if old is None else 'replaced'} {rel} ({len(new)} characters):\n{diff}",
                          diff=diff)


def write_whole(path: Path, text: str) -> None:
    """Make `text` the file's whole content, all or nothing: it goes into a new file beside it,
    flushed to disk, which is then renamed over it, so a full disk, a crash or a kill mid-write
    leaves the old file as it was (written in place, it was emptied first). The old file's mode
    is kept (a new file gets the umask's). Written in place instead, where a rename would change
    what the file is: another user's file (the new one would be ours), one with other hard links
    (they would keep the old text), or where no file can be made beside it (a read-only directory,
    a name at the length limit). A file we may not write is refused, as writing it in place was."""
    data = text.encode("utf-8")
    try:
        old = path.stat()
    except FileNotFoundError:
        old = None
    if old is not None and not os.access(path, os.W_OK):
        raise PermissionError(f"{path.name} is not writable")
    if old is not None and (old.st_nlink > 1 or old.st_uid != os.geteuid()):
        path.write_bytes(data)
        return
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG):
            raise
        path.write_bytes(data)  # nowhere to write it beside: in place, or the error that gives
        return
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if old is not None:
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _refuse_binary(head: bytes, rel: str) -> None:
    if b"\0" in head:
        raise ValueError(f"{rel} is a binary file (a NUL byte in its first 4 KiB); the file tools read text only: "
                         "inspect it with run_command (file, xxd | head)")


def _lines(text: str) -> list[str]:
    """Lines as read_file, grep and editors number them: ended by \n only (str.splitlines would also
    break at a form feed, \r, \x1c-\x1e, \x85, \u2028 and \u2029, and number later lines wrong)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _glob_match(rel: str, glob: str) -> bool:
    """`**` spans directories, `*` stays inside one; a glob without `/` matches a file's name in
    any directory (as in .gitignore). Python < 3.13 has no PurePath.full_match."""
    if "/" not in glob:
        rel = PurePosixPath(rel).name
    pattern = re.escape(glob).replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*") \
        .replace(r"\?", "[^/]")
    return re.fullmatch(pattern, rel) is not None


def _guarded(fn, args: dict, root: Path):
    """A tool's refusals and failures become its result, never an exception in the loop. An OS
    error names its file as the model does, relative to the root ("notes.txt: Permission denied",
    not "[Errno 13] Permission denied: '/home/.../notes.txt'")."""
    try:
        return fn(args)
    except OutsideRoot as e:
        return ToolResult.refused(str(e))
    except OSError as e:
        name = Path(os.fsdecode(e.filename)) if isinstance(e.filename, (str, bytes)) else None
        if name is not None and e.strerror and (name == root or root in name.parents):
            return ToolResult.failed(f"{shown_path(name.relative_to(root).as_posix() or '.')}: {e.strerror}")
        return ToolResult.failed(str(e))
    except (ValueError, UnicodeError) as e:
        return ToolResult.failed(str(e))
