"""Provides the words a chat pane shows about itself: its title, who said each message, its
context gauge and the note about queued or edited messages."""

from __future__ import annotations

from magnitude_tui.store import MessageRecord, PaneRecord, short_title
from magnitude_tui.widgets.format import fmt_count


def pane_title(r: PaneRecord, parent_name: str | None, *, raw: bool = False) -> str:
    """`A1 · main · <the first message, shortened>`; a subagent names its parent and task."""
    role = r.settings.role
    if r.role == "subagent":
        task = f" · {r.task}" if r.task else ""
        return f"{r.name} ← {parent_name or 'closed pane'}{f' · {role}' if role else ''}{task}"
    if r.role == "api":
        return f"{r.name} · API"
    first = next((m.content for m in r.messages if m.role == "user" and not m.author and not m.inherited), "")
    topic = f" · {short_title(first)}" if first.strip() else ""  # what the conversation is about
    return f"{r.name} · {role or 'main'}{' · raw' if raw else ''}{topic}"


def speaker(r: PaneRecord, parent_name: str | None, m: MessageRecord) -> str:
    """Who said `m`, as its header names them."""
    if m.role == "user" and r.role == "subagent":
        return f"task from {parent_name or 'parent'}"
    if r.role == "api":
        # The pane is named after its caller: the caller's messages carry that name, and the
        # model's replies must not carry it too.
        if m.role == "user":
            return f"caller {r.task or r.name}"
        if m.role == "assistant":
            return "model"
    return "you" if m.role == "user" else r.name if m.role == "assistant" else m.role


NARROW_PANE = 32  # columns: a narrower pane's gauge drops its bar, keeping the figures whole


def gauge(used: int | None, size: int | None, endpoint: str | None, *, width: int = 0) -> str:
    """The context gauge in the pane's bottom border: tokens used of the sequence's context; on a
    remote engine, which has no context to gauge, the server the pane runs on (the status line
    names it too, but last, where a narrow pane cuts it). `width`: the pane's (0: unknown)."""
    if endpoint is not None and not size:
        return f"on {endpoint.partition('://')[2] or endpoint}"
    if used is None or not size:
        return ""
    figures = f"{fmt_count(used)}/{fmt_count(size)}"
    if 0 < width < NARROW_PANE:
        return f"ctx {figures}"
    filled = min(8, round(used / size * 8))
    return f"ctx {'▰' * filled}{'▱' * (8 - filled)} {figures}"


def queue_note(queued: list[str], editing: bool) -> str:
    """The line above the status line: what waits to be sent, or that the last message is being
    edited ("" when neither)."""
    if queued:
        first = queued[0].splitlines()[0] if queued[0].strip() else ""
        more = f" (+{len(queued) - 1} more)" if len(queued) > 1 else ""
        return f"queued: {first}{more} · sent when this reply ends · esc stops the reply and returns it to the composer"
    if editing:
        return ("editing your last message · enter sends it again and replaces the reply below it · "
                "empty the composer to cancel")
    return ""
