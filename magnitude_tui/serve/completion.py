"""Provides Completion: one chat-completions call carried out on the engine (n choices, stop strings, timings)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field, replace

from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.serve.body import ChatCall
from magnitude_tui.serve.errors import ErrorType, OpenAIError
from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.serve.tool_calls import check_calls, check_reply
from scheduler.metrics import partition_ms
from scheduler.types import DoneReason, ErrorKind, Phase, Request, SamplingParams, ToolCallDelta


@dataclass
class Choice:
    """One choice's progress as the HTTP side sees it."""

    index: int
    request_id: str
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    last: SeqUpdate | None = None
    phase_at: dict[str, float] = field(default_factory=dict)  # phase -> when first seen
    t_first_token: float | None = None
    t_last_token: float | None = None
    calls: list[dict] = field(default_factory=list)  # {"id", "name", "arguments"} as they stream

    @property
    def done(self) -> bool:
        return self.finish_reason is not None or self.error is not None

    @property
    def completion_tokens(self) -> int:
        return self.last.generated if self.last else 0


@dataclass(frozen=True)
class Delta:
    """Something a stream sends: new text for a choice, or that choice's end."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()

    @property
    def done(self) -> bool:
        """The choice ends with this delta (finished or failed)."""
        return self.finish_reason is not None or self.error is not None


class Completion:
    """Runs a ChatCall: `n` choices share one evaluated prompt (forks of a one-token request that
    evaluates it; the engine cuts stop strings), and the call's own timings are measured from the
    engine's updates as they arrive."""

    def __init__(self, hub: EngineHub, call: ChatCall, *, client_name: str) -> None:
        self.hub = hub
        self.call = call
        self.client_name = client_name
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())  # OpenAI: every chunk of a stream carries the same timestamp
        self.session_base = hub.session_for(client_name)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices: list[Choice] = []
        self.prime: Choice | None = None
        self.t_submit = hub.clock()
        self._submitted = False

    # ---- start -------------------------------------------------------------------------

    def submit(self) -> None:
        """Send what the call starts with, before any await: its choices, or for n > 1 the one
        evaluation of the prompt they fork from. The caller's session is claimed here, so calls
        that arrive together each get their own (a handler that awaited first let another take
        the same free session, and the two ran one after the other)."""
        if self._submitted:
            return
        self._submitted = True
        if self.call.n > 1:
            self.prime = Choice(index=-1, request_id=f"{self.id}-prompt")
            self.hub.submit(self._request(self.prime.request_id, f"{self.session_base}-prompt",
                                          SamplingParams(temperature=0.0, max_tokens=1), None), self.queue, tag=-1)
            self.hub.hold(self.session_base, self.prime.request_id)  # the first choice's, once forked
        else:
            self._submit_choices(None)

    async def start(self) -> None:
        """Submit the choices (`submit`, if the route has not) and wait until each has been
        checked and taken into the engine. OpenAIError if the prompt is refused (too long, bad
        tokens): nothing was sent to the client yet, so the error can be a plain HTTP answer."""
        self.submit()
        if self.call.n > 1:
            self._submit_choices(await self._prompt_evaluated())
        pending = set(range(self.call.n))
        self._early: list[tuple[int, SeqUpdate, float]] = []
        while pending:
            tag, u, t = await self.queue.get()
            self._early.append((tag, u, t))
            if u.phase is not Phase.PREPARING:
                pending.discard(tag)
            if u.phase is Phase.DONE and u.done_reason is DoneReason.ERROR and not u.generated:
                self.cancel()
                raise refusal(u)

    def _submit_choices(self, fork_from: str | None) -> None:
        for i in range(self.call.n):
            sampling = replace(self.call.sampling, stop=self.call.stop)
            if sampling.seed is not None and i:
                sampling = replace(sampling, seed=sampling.seed + i)
            c = Choice(index=i, request_id=f"{self.id}-{i}")
            self.choices.append(c)
            session = self.session_base if i == 0 else f"{self.session_base}-c{i}"
            self.hub.submit(self._request(c.request_id, session, sampling, fork_from), self.queue, tag=i,
                            client_name=self.client_name)

    async def _prompt_evaluated(self) -> str:
        """The prime's session, once its one-token request has evaluated the prompt."""
        assert self.prime is not None  # submit() sent it
        while True:
            _, u, t = await self.queue.get()
            self._observe(self.prime, u, t)
            if u.phase is Phase.DONE:
                if u.done_reason is DoneReason.ERROR:
                    self.hub.let_go(self.session_base, self.prime.request_id)
                    raise refusal(u)
                return f"{self.session_base}-prompt"

    def _request(self, rid: str, session: str, sampling: SamplingParams, fork_from: str | None) -> Request:
        use = self.call.tool_use
        return Request(request_id=rid, session_id=session, messages=self.call.messages,
                       sampling=sampling, fork_from=fork_from, priority=self.call.priority_class,
                       drop_oldest_turns=False, tools=use.tools, tool_choice=use.tool_choice,
                       parallel_tool_calls=use.parallel_tool_calls, response_schema=use.response_schema)

    # ---- progress ----------------------------------------------------------------------

    async def deltas(self):
        """Text and endings, choice by choice, as the engine produces them."""
        backlog, self._early = self._early, []
        for tag, u, t in backlog:
            for d in self._apply(tag, u, t):
                yield d
        while not all(c.done for c in self.choices):
            tag, u, t = await self.queue.get()
            for d in self._apply(tag, u, t):
                yield d

    def _apply(self, tag: int, u: SeqUpdate, t: float) -> list[Delta]:
        if tag < 0 or not 0 <= tag < len(self.choices):
            return []
        c = self.choices[tag]
        if c.done:
            return []
        self._observe(c, u, t)
        out = []
        shown = u.text_delta
        if u.phase is Phase.DONE:
            if u.done_reason is DoneReason.ERROR:
                c.error = u.error or "the request failed"
            elif u.done_reason is DoneReason.CANCELLED:
                c.error = "cancelled on the server (its pane was closed)"
            else:
                c.finish_reason = "length" if u.done_reason is DoneReason.LENGTH else "stop"
        c.text += shown
        if shown:
            out.append(Delta(c.index, text=shown))
        if u.tool_calls:
            for d in u.tool_calls:
                if d.id is not None:
                    c.calls.append({"id": d.id, "name": d.name or "", "arguments": ""})
                if 0 <= d.index < len(c.calls):
                    c.calls[d.index]["arguments"] += d.arguments
            out.append(Delta(c.index, tool_calls=u.tool_calls))
        if c.finish_reason in ("stop", "length") and c.calls:
            # Calls that all arrived whole are the reply, even when the token limit then cut
            # what came after them (a small model may go on opening calls it never finishes).
            problem = check_calls(c.calls, self.call.tool_use.tools)
            if problem is None:
                c.finish_reason = "tool_calls"
            elif c.finish_reason == "stop":
                c.finish_reason, c.error = None, problem
        schema = self.call.tool_use.response_schema
        if c.finish_reason == "stop" and schema is not None:
            # The grammar makes the reply JSON of the schema's shape; what the converter cannot
            # express (numeric bounds, for one) is checked here, so no reply that fails its schema
            # passes as a finished one.
            problem = check_reply(c.text, schema)
            if problem is not None:
                c.finish_reason, c.error = None, problem
        if c.done:
            out.append(Delta(c.index, finish_reason=c.finish_reason, error=c.error))
        return out

    def _observe(self, c: Choice, u: SeqUpdate, t: float) -> None:
        c.last = u
        c.phase_at.setdefault(u.phase.value, t)
        if u.new_tokens:
            c.t_first_token = c.t_first_token or t
            c.t_last_token = t

    async def run_to_end(self) -> None:
        async for _ in self.deltas():
            pass

    def cancel(self) -> None:
        """The client went away (or the call failed): stop every choice still running."""
        for c in self.choices:
            if not c.done:
                self.hub.cancel(c.request_id)
        if self.prime is not None and (self.prime.last is None or self.prime.last.phase is not Phase.DONE):
            self.hub.cancel(self.prime.request_id)
        if self.prime is not None:
            self.hub.let_go(self.session_base, self.prime.request_id)

    # ---- figures -----------------------------------------------------------------------

    def usage(self) -> dict:
        first = self.prime or self.choices[0]
        u = first.last
        prompt = u.prompt_total if u else 0
        cached = u.cached_tokens if u else 0
        completion = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def timings(self) -> dict:
        """llama-server's `timings` object, plus this engine's own figures under the same key."""
        c = self.choices[0]
        first = self.prime or c
        u, fu = c.last, first.last
        cache_n = fu.cached_tokens if fu else 0
        prompt_n = (fu.prompt_total - cache_n) if fu else 0
        ttft = u.ttft_ms if u and u.ttft_ms is not None else None
        queue = u.queue_ms if u and u.queue_ms is not None else 0.0
        prompt_ms = (ttft - queue) if ttft is not None else None
        if self.prime is not None and fu is not None and fu.ttft_ms is not None:
            prompt_ms = fu.ttft_ms - (fu.queue_ms or 0.0)
        predicted_n = c.completion_tokens
        predicted_ms = ((c.t_last_token - c.t_first_token) * 1000.0
                        if c.t_first_token is not None and c.t_last_token is not None else 0.0)
        phases = self._phase_ms(first)
        if fu is not None and fu.ttft_ms is not None and fu.prefill_ms is not None:
            # The engine's own cut of the time to the first token (preparing, queued, prefill add up
            # to TTFT exactly), then what the stream took after it.
            parts = partition_ms([fu.preparing_ms or 0.0, fu.queue_ms or 0.0, fu.prefill_ms], 2)
            phases = dict(zip(("preparing", "queued", "prefill"), parts))
            phases["generating"] = _r(predicted_ms)
            prompt_ms = parts[2]
            if self.prime is None:  # the figures quoted beside the phases are the same rounded cut
                queue, ttft = parts[1], round(sum(parts), 2)
        return {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": _r(prompt_ms),
            "prompt_per_second": _r(prompt_n / prompt_ms * 1000.0) if prompt_ms else None,
            "predicted_n": predicted_n,
            "predicted_ms": _r(predicted_ms),
            "predicted_per_second": _r((predicted_n - 1) / predicted_ms * 1000.0)
            if predicted_ms > 0 and predicted_n > 1 else None,
            "queue_ms": _r(queue),
            "ttft_ms": _r(ttft),
            "itl_p50_ms": _r(u.itl_p50_ms) if u else None,
            "itl_p95_ms": _r(u.itl_p95_ms) if u else None,
            "phases_ms": phases,
            # Time sampling spent under this reply's grammar (tools, response_format); 0 if none.
            "grammar_ms": _r(u.grammar_ms) if u else 0.0,
        }

    def _phase_ms(self, c: Choice) -> dict[str, float | None]:
        order = sorted(c.phase_at.items(), key=lambda kv: kv[1])
        out: dict[str, float | None] = {}
        start = self.t_submit
        for i, (phase, t) in enumerate(order):
            if phase == Phase.DONE.value:
                break
            end = order[i + 1][1] if i + 1 < len(order) else self.hub.clock()
            out[phase] = _r((end - max(t, start)) * 1000.0)
        return out


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


def refusal(u: SeqUpdate) -> OpenAIError:
    """The engine ended the request before it produced anything: say why, as OpenAI would."""
    message = u.error or "the request failed"
    if u.error_kind is ErrorKind.CONTEXT_LENGTH:
        return OpenAIError(400, message, ErrorType.INVALID_REQUEST, "context_length_exceeded", "messages")
    if u.error_kind is ErrorKind.INVALID:
        # A schema the grammar converter cannot express names its parameter first (backend/grammar.py).
        param = next((p for p in ("response_format", "tools", "tool_choice") if message.startswith(p)), "messages")
        return OpenAIError(400, message, ErrorType.INVALID_REQUEST, "invalid_request", param)
    return OpenAIError(503, message, ErrorType.UNAVAILABLE, "engine_unavailable", retry_after_s=2)
