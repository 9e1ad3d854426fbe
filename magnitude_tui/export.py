"""Provides what leaves the app from a pane: a Markdown export of the conversation (marking what
is partial, cancelled, out of context or still queued) and the last answer."""

from __future__ import annotations

import time
from pathlib import Path

from magnitude_tui.widgets.chat_pane import ChatPane


def pane_markdown(pane: ChatPane) -> str:
    lines = [f"# {pane.title}", ""]
    if pane.record.settings.system:
        lines += ["## system prompt", "", pane.record.settings.system, ""]
    for m in pane.record.messages:
        who = f"{m.author} (subagent answer)" if m.author else m.role
        who += " (inherited context)" if m.inherited else ""
        if m.role == "assistant" and not m.complete:
            who += " (partial: still streaming)" if pane.is_streaming(m) else " (partial: interrupted)"
        elif m.done_reason in ("cancelled", "error", "length"):
            who += f" (ended: {m.done_reason})"
        if pane.is_dropped(m):
            who += " (out of context)"
        lines += [f"## {who}", "", m.content, ""]
    for text in pane.queued:
        lines += ["## user (queued, not sent yet)", "", text, ""]
    return "\n".join(lines)


def export_pane(pane: ChatPane, directory: Path) -> Path:
    """Write the pane's conversation to a new Markdown file in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"magnitude-{pane.record.name}-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(pane_markdown(pane), encoding="utf-8")
    return path
