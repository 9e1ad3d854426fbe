"""Provides AgentLoop: turns of one agent on one session (request, tool calls, approval, tool results) until it answers."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Sequence

from magnitude_tui.agent.engine_link import TurnRunner
from magnitude_tui.agent.events import (
    AgentFinished,
    AgentObserver,
    ApprovalDecided,
    ApprovalWaiting,
    EndReason,
    TextDelta,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    TurnRetried,
    TurnRetry,
    TurnStarted,
    ignore,
)
from magnitude_tui.agent.policy import ApprovalGate, ApprovalRequest
from magnitude_tui.agent.toolbox import AgentTool, ToolResult, sendable
from magnitude_tui.serve.tool_calls import check_calls
from scheduler.types import (
    DoneReason,
    ErrorKind,
    Message,
    Priority,
    Request,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
)

# A turn whose newest tool results do not fit the context is asked again with them halved, up to
# this many times, while they hold more than MIN_CUT_CHARS (a `cat` of a big file in an 8k context
# failed the whole run; below that, the history itself is what does not fit).
MAX_CUTS, MIN_CUT_CHARS = 6, 1_000


@dataclass(frozen=True)
class AgentConfig:
    """Who the agent is and how its turns are sent."""

    name: str  # in approval requests and events ("main", "main/2")
    session_id: str  # every turn runs in this conversation, so its KV stays resident
    sampling: SamplingParams = SamplingParams(max_tokens=1024)
    max_turns: int = 20
    first_tool_choice: ToolChoiceMode = ToolChoiceMode.AUTO  # REQUIRED: the first turn must call a tool
    parent: str | None = None  # a subagent's parent agent
    fork_from: str | None = None  # a subagent starts from its parent's KV
    depth: int = 0  # 0: the main agent; n: a subagent of a depth n - 1 agent
    priority: Priority = Priority.AGENT


@dataclass
class AgentOutcome:
    reason: EndReason
    answer: str
    messages: list[Message]
    turns: list[TurnFinished] = field(default_factory=list)
    error: str | None = None
    truncated: bool = False  # the answer's turn reached max_tokens: the text stops mid-way

    @property
    def ok(self) -> bool:
        return self.reason is EndReason.ANSWERED


class AgentLoop:
    def __init__(self, runner: TurnRunner, config: AgentConfig, tools: Sequence[AgentTool], gate: ApprovalGate,
                 observer: AgentObserver = ignore) -> None:
        self.runner = runner
        self.config = config
        self.tools = {t.name: t for t in tools}
        self.gate = gate
        self.observer = observer
        self.messages: list[Message] = []  # the conversation so far (spawn_agents forks it)
        self._uncut: dict[int, str] = {}  # message index -> a tool result as the tool gave it
        self._kept: dict[int, int] = {}  # message index -> how much of it the model is shown
        self._schemas = tuple(t.tool for t in tools)

    @property
    def name(self) -> str:
        return self.config.name

    async def run(self, task: str, history: Sequence[Message] = ()) -> AgentOutcome:
        """Answer `task` (a user turn after `history`, which holds the system turn if any)."""
        self.messages = [*history, Message("user", task)]
        self._uncut.clear()
        self._kept.clear()
        turns: list[TurnFinished] = []
        cfg = self.config
        for turn in range(1, cfg.max_turns + 1):
            retries: list[TurnRetry] = []
            while True:
                request = self._request(turn)
                self.observer(TurnStarted(cfg.name, turn, request.request_id))
                result = await self.runner.turn(request, lambda t: self.observer(TextDelta(cfg.name, t)))
                f = result.final
                # The newest tool results did not fit: the same turn is asked again with them
                # shortened. It stays one turn (events, outcome, JSON), its refused attempts said.
                if f.error_kind is not ErrorKind.CONTEXT_LENGTH or len(retries) >= MAX_CUTS:
                    break
                halved = self._cut_newest_results()
                if halved is None:
                    break
                kept, whole = halved
                retry = TurnRetry(len(retries) + 1,
                                  f"the prompt did not fit the context; the newest tool results were cut to "
                                  f"{kept:,} of {whole:,} characters", f.error or "")
                retries.append(retry)
                self.observer(TurnRetried(cfg.name, turn, retry))
            done = TurnFinished(cfg.name, turn, f.prompt_total, f.cached_tokens, f.generated, result.calls,
                                tuple(retries))
            turns.append(done)
            self.observer(done)
            if f.error is not None:
                error = f.error
                if f.error_kind is ErrorKind.CONTEXT_LENGTH:
                    error = (f"the conversation outgrew the context (an agent never drops its oldest turns: they hold "
                             f"its task): {error}")
                return self._end(EndReason.FAILED, result.text, turns, error)
            self.messages.append(Message("assistant", result.text, tool_calls=result.calls))
            if not result.calls:
                outcome = self._end(EndReason.ANSWERED, result.text, turns)
                outcome.truncated = f.done_reason is DoneReason.LENGTH
                return outcome
            # A reply cut at max_tokens may end inside its last call's arguments (then they do not parse).
            last = result.calls[-1]
            cut = last if f.done_reason is DoneReason.LENGTH and not _parses(last.arguments) else None
            for call in result.calls:
                out = await self.call_tool(call, cut=call is cut)
                self.messages.append(Message("tool", out.text, tool_call_id=call.id, name=call.name))
        return self._end(EndReason.MAX_TURNS, "", turns,
                         f"no answer after {cfg.max_turns} turns (every turn called tools)")

    def _cut_newest_results(self) -> tuple[int, int] | None:
        """Halve the tool results after the last assistant turn (their head kept, the cut said):
        the characters kept and the whole results' characters; None when they are already small:
        then the history itself is what does not fit."""
        newest = []
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role != "tool":
                break
            newest.append(i)
        whole = {i: self._uncut.setdefault(i, self.messages[i].content) for i in newest}
        if sum(self._kept.get(i, len(whole[i])) for i in newest) <= MIN_CUT_CHARS:
            return None
        for i in newest:
            keep = self._kept[i] = self._kept.get(i, len(whole[i])) // 2
            cut = len(whole[i]) - keep
            if cut:
                note = f"\n[{cut:,} of {len(whole[i]):,} characters cut: the whole result did not fit in the context]"
                self.messages[i] = replace(self.messages[i], content=whole[i][:keep] + note)
        return sum(self._kept[i] for i in newest), sum(len(whole[i]) for i in newest)

    def _request(self, turn: int) -> Request:
        cfg = self.config
        mode = cfg.first_tool_choice if turn == 1 and self._schemas else ToolChoiceMode.AUTO
        return Request(request_id=f"{cfg.session_id}-t{turn}-{uuid.uuid4().hex[:6]}", session_id=cfg.session_id,
                       messages=tuple(self.messages), sampling=cfg.sampling,
                       fork_from=cfg.fork_from if turn == 1 else None, priority=cfg.priority,
                       tools=self._schemas, tool_choice=ToolChoice(mode),
                       # An agent's oldest turn is its task: a history too long fails the turn
                       # (the engine says so) rather than going on without the task.
                       drop_oldest_turns=False)

    def _end(self, reason: EndReason, answer: str, turns: list[TurnFinished], error: str | None = None) -> AgentOutcome:
        self.observer(AgentFinished(self.config.name, reason, answer, error))
        return AgentOutcome(reason, answer, self.messages, turns, error)

    async def call_tool(self, call: ToolCall, *, cut: bool = False) -> ToolResult:
        """Check, approve and run one call; whatever happens, the model gets a result. `cut`: the
        reply ended at max_tokens with this call, which may be unfinished. The call's duration is
        its own (checks, preview, run): the wait for a person's approval is reported apart."""
        t0 = time.monotonic()
        waited: list[float] = []  # the wait for approval, when someone was asked
        result = sendable(await self._checked_call(call, cut, waited))
        wait_s = waited[0] if waited else None
        self.observer(ToolFinished(self.config.name, call, max(0.0, time.monotonic() - t0 - (wait_s or 0.0)),
                                   len(result.text), result.ok, result.text, approval_wait_s=wait_s))
        return result

    async def _checked_call(self, call: ToolCall, cut: bool, waited: list[float]) -> ToolResult:
        problem = check_calls([{"name": call.name, "arguments": call.arguments}], self._schemas)
        if problem is not None and cut:
            return ToolResult.failed(f"the reply reached its limit of {self.config.sampling.max_tokens} tokens "
                                     f"before this call's arguments ended ({problem}); make the change in "
                                     "smaller calls")
        if problem is not None:
            return ToolResult.failed(problem)
        tool = self.tools[call.name]
        if tool.unavailable is not None:
            return ToolResult.failed(f"{call.name} is unavailable: {tool.unavailable}")
        args = json.loads(call.arguments or "{}")
        prepared = self._prepared(tool, args)
        if isinstance(prepared, ToolResult):  # refused or impossible: nobody needs to be asked
            return prepared
        preview, caution = prepared
        asked = self.gate.needs_asking(tool.kind, tool.name, caution)
        if asked:
            self.observer(ApprovalWaiting(self.config.name, call))
        t0 = time.monotonic()
        decision = await self.gate.decide(ApprovalRequest(self.config.name, self.config.parent, tool.name,
                                                          call.arguments, tool.kind, preview, caution))
        if asked:
            waited.append(time.monotonic() - t0)
            self.observer(ApprovalDecided(self.config.name, call, decision, waited[0]))
        if not decision.allowed:
            return ToolResult(f"denied: {decision.reason or 'the user did not allow it'}", ok=False)
        if asked and preview is not None:
            # What was allowed is what runs: a file changed, or a path swapped for a link (to
            # .git/config, another file), while the question was open is not written unseen.
            changed = self._changed_since_allowed(tool, args, preview, caution)
            if changed is not None:
                return changed
        self.observer(ToolStarted(self.config.name, call))
        try:
            return await tool.run(args)
        except Exception as e:  # a tool's bug must not end the agent: the model reads what failed
            return ToolResult.failed(f"{call.name} failed: {type(e).__name__}: {e}")

    @staticmethod
    def _prepared(tool: AgentTool, args: dict) -> tuple[str | None, str | None] | ToolResult:
        """The call's preview (what it would change) and caution (why it is asked each time: a
        write git would act on, a file with other names), or the refusal its preview gave, or
        the failure preparing it (as for run, a preview's bug must not end the agent)."""
        try:
            preview = tool.preview(args) if tool.preview is not None else None
            if isinstance(preview, ToolResult):
                return preview
            return preview, tool.caution(args) if tool.caution is not None else None
        except Exception as e:
            return ToolResult.failed(f"{tool.name} failed before it ran (preparing it): {type(e).__name__}: {e}")

    @staticmethod
    def _changed_since_allowed(tool: AgentTool, args: dict, preview: str, caution: str | None) -> ToolResult | None:
        """A failure when the call would now change something else than what was allowed (its
        preview, the diff with the real path, or its caution differ); None when it is the same."""
        prepared = AgentLoop._prepared(tool, args)
        if isinstance(prepared, ToolResult):
            return prepared
        if prepared != (preview, caution):
            return ToolResult.failed(f"{tool.name} was not run: what it would change is no longer what was allowed "
                                     "(the file, or where its path leads, changed meanwhile); nothing was "
                                     "written. Read it again and call again")
        return None


def _parses(text: str) -> bool:
    try:
        json.loads(text or "{}")
    except ValueError:
        return False
    return True
