"""Provides TurnRunner, the loop's seam to an engine (one request in, its text and tool calls out), and HubRunner over an EngineHub."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol

from backend.tools import new_call_id
from magnitude_tui.engine.events import SeqUpdate
from scheduler.types import Phase, Request, ToolCall, ToolCallDelta


@dataclass(frozen=True)
class TurnResult:
    text: str
    calls: tuple[ToolCall, ...]
    final: SeqUpdate  # the request's DONE update (its reason, error, prompt and cached token counts)


class TurnRunner(Protocol):
    async def turn(self, request: Request, on_text: Callable[[str], None]) -> TurnResult:
        """Run one request to its end; cancelling the await cancels the request."""
        ...

    def close_session(self, session_id: str) -> None:
        """Free a finished subagent's KV."""
        ...


class CallAssembler:
    """Puts streamed tool-call pieces together: the first piece of a call names it, later ones
    extend its arguments (kept as the model wrote them, so the next turn renders the same text)."""

    def __init__(self) -> None:
        self._calls: dict[int, dict] = {}

    def add(self, deltas: tuple[ToolCallDelta, ...]) -> None:
        for d in deltas:
            call = self._calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] = call["name"] or d.name
            call["arguments"] += d.arguments

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c["id"] or new_call_id(), c["name"] or "", c["arguments"])
                     for _, c in sorted(self._calls.items()))


async def collect_turn(next_update: Callable[[], Awaitable[SeqUpdate]],
                       on_text: Callable[[str], None]) -> TurnResult:
    """One turn's text and calls, read from its updates until it is done (every runner's loop)."""
    text: list[str] = []
    calls = CallAssembler()
    while True:
        u = await next_update()
        if u.text_delta:
            text.append(u.text_delta)
            on_text(u.text_delta)
        calls.add(u.tool_calls)
        if u.phase is Phase.DONE:
            return TurnResult("".join(text), calls.calls(), u)


class HubRunner:
    """Turns through an EngineHub: the headless run's own, or the one the TUI and serve share (so
    agents' requests are routed beside the panes' and HTTP callers')."""

    def __init__(self, hub) -> None:
        self.hub = hub

    async def turn(self, request: Request, on_text: Callable[[str], None]) -> TurnResult:
        queue: asyncio.Queue = asyncio.Queue()
        self.hub.submit(request, queue)

        async def next_update():
            return (await queue.get())[1]

        try:
            return await collect_turn(next_update, on_text)
        except asyncio.CancelledError:
            self.hub.cancel(request.request_id)
            raise

    def close_session(self, session_id: str) -> None:
        self.hub.client.close_session(session_id)
