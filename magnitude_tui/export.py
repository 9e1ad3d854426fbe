"""Provides what leaves the app from a pane: a Markdown export of the conversation (marking what
is partial, cancelled, out of context or still queued) and the last answer."""

from __future__ import annotations

import re
import time
from pathlib import Path

import platformdirs

from magnitude_tui.engine.text import encodable_text
from magnitude_tui.widgets.chat_pane import ChatPane


def pane_markdown(pane: ChatPane) -> str:
    lines = [f"# {pane.title}", ""]
    if pane.record.settings.system:
        lines += ["## system prompt", "", pane.record.settings.system, ""]
    for m in pane.record.messages:
        marks = " (inherited context)" if m.inherited else ""
        if m.role == "assistant" and not m.complete:
            marks += " (partial: still streaming)" if pane.is_streaming(m) else " (partial: interrupted)"
        elif m.done_reason in ("cancelled", "error", "length"):
            marks += f" (ended: {m.done_reason})"
        if pane.is_dropped(m):
            marks += " (out of context)"
        if m.others:
            marks += f" (answer {m.shown + 1} of {len(m.others) + 1}, the one sent on)"
        if m.call is not None:  # an agent's tool result
            how = ("ok" if m.ok else "failed") + ("" if m.duration_s is None else f", {m.duration_s:.1f} s")
            lines += [f"## tool result: `{m.call.name}` ({how}){marks}", "", _fenced(m.content), ""]
            continue
        who = f"{m.author} (subagent answer)" if m.author else m.role
        lines += [f"## {who}{marks}", ""] + ([_closed(m.content), ""] if m.content or not m.tool_calls else [])
        for call in m.tool_calls:
            lines += [f"called `{call.name}` with", "", _fenced(call.arguments), ""]
        for k, other in enumerate(m.answers):
            if k != m.shown:
                lines += [f"### other answer {k + 1} of {len(m.others) + 1}", "", _closed(other), ""]
    for text in pane.queued:
        lines += ["## user (queued, not sent yet)", "", _closed(text), ""]
    return "\n".join(lines)


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def _closed(text: str) -> str:
    """`text` with a code fence it leaves open closed: a reply cut off inside a code block (at
    its token limit, or stopped) turned every heading and message after it in the export into
    that block's code."""
    fence = ""
    for line in text.splitlines():
        found = _FENCE.match(line)
        if found is None:
            continue
        run = found.group(1)
        if not fence:
            if run[0] == "~" or "`" not in line[found.end():]:  # an info string holds no backtick
                fence = run
        elif run[0] == fence[0] and len(run) >= len(fence) and not line[found.end():].strip():
            fence = ""
    return f"{text}\n{fence}" if fence else text


def _fenced(text: str) -> str:
    """`text` in a code fence longer than any run of backticks in it (a file may hold fences)."""
    ticks = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, ticks + 1)
    return f"{fence}\n{text}\n{fence}"


def default_export_dir() -> Path:
    """`exports` in the user's data directory, beside the database (not wherever the app was
    started: exports there were scattered and easy to lose)."""
    return Path(platformdirs.user_data_dir("magnitude-tui", appauthor=False)) / "exports"


def safe_name(name: str) -> str:
    """A file-name part from a pane name: letters, digits, `.`, `_` and `-` only ("A1 (2)" ->
    "A1-2", "api@127.0.0.1" -> "api-127.0.0.1"), so the path can be pasted into a shell."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-.") or "pane"


def export_pane(pane: ChatPane, directory: Path) -> Path:
    """Write the pane's conversation to a new Markdown file in `directory`; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"magnitude-{safe_name(pane.record.name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, k = directory / f"{stem}.md", 1
    while path.exists():  # two exports of one pane within a second
        k += 1
        path = directory / f"{stem}-{k}.md"
    # A lone surrogate (a remote server's "\ud800" escape in a reply) raised UnicodeEncodeError,
    # which is no OSError: the app quit instead of exporting.
    try:
        path.write_text(encodable_text(pane_markdown(pane)), encoding="utf-8")
    except OSError:  # a full disk: a cut-off export must not be left looking like a whole one
        path.unlink(missing_ok=True)  # the name was free: the file is this call's own
        raise
    return path.resolve()
