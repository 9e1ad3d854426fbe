"""Provides the approval vocabulary: tool kinds, a role's approve policy, requests, decisions and the Approval protocol."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class ToolKind(str, Enum):
    """What a tool may do to the machine; decides whether it needs approval."""

    READ = "read-only"  # looks, never changes anything (read_file, list_dir, search)
    WRITE = "writes"  # changes files (edit_file, write_file)
    RUN = "runs"  # runs a program (run_command, an MCP tool that does not say it only reads)


class ApprovePolicy(str, Enum):
    """A role's `approve` key in agents.toml."""

    ASK = "ask"  # reads run at once; every write and run waits for the user's decision
    READ_ONLY = "read-only"  # reads only: writing and running tools are refused, never asked
    AUTO = "auto"  # everything runs without asking

    @classmethod
    def parse(cls, text: str) -> "ApprovePolicy":
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"approve {text!r} is not a policy; use ask, read-only or auto") from None

    def strictest(self, other: "ApprovePolicy") -> "ApprovePolicy":
        """The stricter of two policies: a subagent never gets more freedom than its parent."""
        order = (ApprovePolicy.READ_ONLY, ApprovePolicy.ASK, ApprovePolicy.AUTO)
        return order[min(order.index(self), order.index(other))]


class Verdict(str, Enum):
    ALLOW_ONCE = "allow_once"
    ALLOW_PANE = "allow_pane"  # this tool, for the rest of this agent's pane
    DENY = "deny"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""  # with DENY: sent to the model as the tool's result

    @property
    def allowed(self) -> bool:
        return self.verdict is not Verdict.DENY


ALLOW_ONCE = Decision(Verdict.ALLOW_ONCE)
ALLOW_PANE = Decision(Verdict.ALLOW_PANE)


def deny(reason: str = "") -> Decision:
    return Decision(Verdict.DENY, reason)


@dataclass(frozen=True)
class ApprovalRequest:
    """What the user is asked about: who calls which tool with what (a subagent names its parent)."""

    agent: str
    parent: str | None
    tool: str
    arguments: str  # the call's JSON arguments, whole
    kind: ToolKind
    preview: str | None = None  # the diff an edit or write would make
    # Why this one call is asked about even when its tool is allowed for the pane (a write into
    # .git, where git finds hooks and commands to run; a file with other hard links).
    caution: str | None = None

    def describe(self) -> str:
        """Several lines for a terminal prompt or a dialog."""
        who = self.agent if self.parent is None else f"{self.agent} (subagent of {self.parent})"
        try:
            args = json.dumps(json.loads(self.arguments), indent=2, ensure_ascii=False)
        except ValueError:
            args = self.arguments
        lines = [f"{who} wants to call {self.tool} ({self.kind.value}):"]
        if self.caution:
            lines.append(f"caution: {self.caution} (asked each time, even with {self.tool} allowed)")
        lines.append(args)
        if self.preview:
            lines.append(self.preview)
        return "\n".join(lines)


class Approval(Protocol):
    """Whoever decides (a dialog, a terminal prompt, a test script)."""

    async def ask(self, request: ApprovalRequest) -> Decision: ...


class ApprovalGate:
    """One agent's approval state: its role's policy, the asker, and the tools allowed for its pane."""

    def __init__(self, policy: ApprovePolicy, approval: Approval | None,
                 ask_anyway: frozenset[str] = frozenset()) -> None:
        """`approval` None: nobody can be asked, so what needs asking is denied. `ask_anyway`: tools
        asked about even under `auto` (a subagent's tools that its parent could not run unasked)."""
        self.policy = policy
        self.approval = approval
        self.ask_anyway = ask_anyway
        self.allowed_tools: set[str] = set()

    def runs_unasked(self, tool: str) -> bool:
        """Whether this tool's writes and commands run without a question (`auto`, not held back)."""
        return self.policy is ApprovePolicy.AUTO and tool not in self.ask_anyway

    def needs_asking(self, kind: ToolKind, tool: str, caution: str | None = None) -> bool:
        asks = self.policy is not ApprovePolicy.READ_ONLY and not self.runs_unasked(tool)
        return kind is not ToolKind.READ and asks and (tool not in self.allowed_tools or bool(caution))

    async def decide(self, request: ApprovalRequest) -> Decision:
        if request.kind is ToolKind.READ or self.runs_unasked(request.tool):
            return ALLOW_ONCE
        if self.policy is ApprovePolicy.READ_ONLY:
            return deny(f"this agent's role is read-only: {request.tool} ({request.kind.value}) is not allowed")
        if request.tool in self.allowed_tools and not request.caution:  # a cautioned call is asked each time
            return ALLOW_PANE
        if self.approval is None:
            return deny("nobody is there to approve it")
        decision = await self.approval.ask(request)
        if decision.verdict is Verdict.ALLOW_PANE:
            self.allowed_tools.add(request.tool)
        return decision


class FixedApproval:
    """Answers every request the same way (headless without a terminal, tests)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest) -> Decision:
        self.asked.append(request)
        return self.decision
