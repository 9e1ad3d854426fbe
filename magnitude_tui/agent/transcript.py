"""Provides RunRecorder: what a headless run prints as it happens (tool blocks, approvals, subagents) and its JSON document."""

from __future__ import annotations

import json
import re
from typing import TextIO

from magnitude_tui.agent.events import (
    AgentEvent,
    AgentFinished,
    ApprovalDecided,
    SubagentSpawned,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnRetried,
)
from magnitude_tui.agent.loop import AgentOutcome

# Tool results longer than this are folded in the printed transcript (the model got all of it).
FOLD_CHARS = 600

# What a terminal would act on instead of showing: C0 controls but tab and newline (a carriage
# return or an escape sequence can rewrite what is on screen), DEL, C1 controls, and the
# bidirectional overrides and isolates that reorder a line ("Trojan Source").
# A carriage return ending a line (CRLF files) is left alone.
_UNSEEN = re.compile("\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """`text` with what a terminal would act on written out as escapes (\\x1b, \\r, \\u202e), so a
    file's or a command's bytes cannot hide or rewrite what is shown (an approval's diff above all)."""
    return _UNSEEN.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


class RunRecorder:
    """An AgentObserver: prints the transcript to `out` (unless quiet) and keeps what the JSON needs."""

    def __init__(self, out: TextIO | None) -> None:
        self.out = out
        self.tools: list[dict] = []
        self.turns: list[dict] = []
        self.subagents: list[dict] = []
        self._at_line_start = True

    def __call__(self, e: AgentEvent) -> None:
        if isinstance(e, TurnFinished):
            self.turns.append({"agent": e.agent, "turn": e.turn, "prompt_tokens": e.prompt_tokens,
                               "cached_tokens": e.cached_tokens, "generated_tokens": e.generated,
                               "tool_calls": len(e.calls), "attempts": e.attempts,
                               "retries": [{"attempt": r.attempt, "reason": r.reason, "error": r.error}
                                           for r in e.retries]})
        elif isinstance(e, ToolFinished):
            self.tools.append({"agent": e.agent, "id": e.call.id, "name": e.call.name,
                               "arguments": e.call.arguments, "ok": e.ok, "duration_s": round(e.duration_s, 4),
                               "approval_wait_s": None if e.approval_wait_s is None else round(e.approval_wait_s, 4),
                               "result_chars": e.result_chars})
        elif isinstance(e, SubagentSpawned):
            self.subagents.append({"agent": e.child, "parent": e.agent, "session_id": e.session_id,
                                   "task": e.task, "role": e.role})
        if self.out is not None:
            self._print(e)

    def _line(self, text: str) -> None:
        assert self.out is not None  # printing is asked for only with a stream to print on
        if not self._at_line_start:
            self.out.write("\n")
        self.out.write(text + "\n")
        self.out.flush()
        self._at_line_start = True

    def _print(self, e: AgentEvent) -> None:
        if isinstance(e, TextDelta):
            assert self.out is not None
            if self._at_line_start:
                self.out.write(f"[{e.agent}] ")
            self.out.write(e.text)
            self.out.flush()
            self._at_line_start = e.text.endswith("\n")
        elif isinstance(e, ToolStarted):
            self._line(f"[{e.agent}] ▶ {e.call.name} {e.call.arguments}")
        elif isinstance(e, ToolFinished):
            body = e.result if len(e.result) <= FOLD_CHARS else \
                e.result[:FOLD_CHARS] + f"… [{e.result_chars - FOLD_CHARS} more characters]"
            mark = "✓" if e.ok else "✗"
            waited = "" if e.approval_wait_s is None else f"waited {e.approval_wait_s:.1f} s for approval · "
            self._line(f"[{e.agent}] {mark} {e.call.name} · {e.duration_s * 1000:.0f} ms · {waited}"
                       f"{e.result_chars} chars\n"
                       + "\n".join("    " + visible(line) for line in re.split("\r?\n", re.sub("\r?\n\\Z", "", body))))
        elif isinstance(e, ApprovalDecided):
            self._line(f"[{e.agent}] approval for {e.call.name}: {e.decision.verdict.value}"
                       + (f" ({e.decision.reason})" if e.decision.reason else "") + f" after {e.wait_s:.1f} s")
        elif isinstance(e, SubagentSpawned):
            self._line(f"[{e.agent}] spawned {e.child} (session {e.session_id}): {e.task}")
        elif isinstance(e, TurnRetried):
            self._line(f"[{e.agent}] turn {e.turn} asked again (attempt {e.retry.attempt + 1}): {e.retry.reason}")
        elif isinstance(e, TurnFinished):
            attempts = f" (attempt {e.attempts})" if e.retries else ""
            self._line(f"[{e.agent}] turn {e.turn}{attempts}: {e.prompt_tokens} prompt tokens ({e.cached_tokens} cached), "
                       f"{e.generated} generated, {len(e.calls)} tool call(s)")
        elif isinstance(e, AgentFinished):
            self._line(f"[{e.agent}] {e.reason.value}" + (f": {e.error}" if e.error else ""))

    def document(self, task: str, role: str | None, outcome: AgentOutcome, problems: dict[str, str]) -> dict:
        return {
            "task": task, "role": role, "ended": outcome.reason.value, "answer": outcome.answer,
            "truncated": outcome.truncated,
            "error": outcome.error, "turns": self.turns, "tools": self.tools, "subagents": self.subagents,
            "mcp_problems": problems,
            "messages": [message_json(m) for m in outcome.messages],
        }


def message_json(m) -> dict:
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"], out["name"] = m.tool_call_id, m.name
    return out


def dump(doc: dict, out: TextIO) -> None:
    json.dump(doc, out, indent=2, ensure_ascii=False)
    out.write("\n")
