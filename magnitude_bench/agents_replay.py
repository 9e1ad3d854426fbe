"""Provides the replay of an agent trace against any Side: agents resend their whole history each call."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import suppress
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from magnitude_bench.agents_trace import AgentTrace, Trace, Turn


class CallKind(Enum):
    TURN = "turn"  # an agent's own call (its first, or one after a tool result)
    SUBAGENT = "subagent"  # one call of a burst, forked from its parent's context


@dataclass
class CallRecord:
    """One call as the client saw it, and the token counts the side reported for it."""

    index: int
    agent: int
    conv: str  # the conversation (HTTP `user`, engine session) it belongs to
    kind: CallKind
    turn: int
    # The call whose prompt + reply is a prefix of this call's prompt (the agent's previous call,
    # or for a subagent its parent's call it forks after); None for an agent's first call.
    extends: int | None
    t_send: float = 0.0
    t_first: float | None = None
    t_end: float | None = None
    prompt_tokens: int = 0
    evaluated: int = 0  # prompt tokens the side evaluated (not found in its cache)
    completion_tokens: int = 0
    # The reply ran to max_tokens: its last token was sampled but never evaluated, so the next
    # call that extends it must evaluate that token too.
    by_length: bool = False
    text: str = ""
    error: str | None = None
    # Times the call was sent again because the server closed its connection before answering
    # (the official openai client retries those too); the time lost counts in its TTFT.
    resent: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send


class Side(Protocol):
    """What the replay drives: one call of a conversation (fills `record`), and the KV in use now."""

    name: str

    async def call(self, record: CallRecord, messages: list[dict], max_tokens: int) -> None: ...

    async def kv(self) -> tuple[int, int] | None:
        """(cells in use, cells in all) now, or None when the side cannot say."""
        ...


@dataclass
class Replay:
    """One run of a trace on one side."""

    calls: list[CallRecord] = field(default_factory=list)
    kv: list[tuple[float, int, int]] = field(default_factory=list)  # (s since start, used, total)
    makespan_s: float = 0.0


class _Run:
    def __init__(self, trace: Trace, side: Side, tag: str, kv_every_s: float) -> None:
        self.trace, self.side, self.tag, self.kv_every_s = trace, side, tag, kv_every_s
        self.out = Replay()

    async def call(self, agent: int, conv: str, kind: CallKind, turn: int, extends: CallRecord | None,
                   messages: list[dict], max_tokens: int) -> CallRecord:
        record = CallRecord(len(self.out.calls), agent, conv, kind, turn,
                            None if extends is None else extends.index)
        self.out.calls.append(record)
        record.t_send = time.perf_counter()
        try:
            await self.side.call(record, messages, max_tokens)
        except Exception as e:  # one failed call is a row with its error, not a lost run
            record.error = f"{type(e).__name__}: {e}"
        record.t_end = time.perf_counter()
        return record

    async def agent(self, i: int, a: AgentTrace) -> None:
        conv = f"{self.tag}-{a.name}"
        messages = [{"role": "system", "content": a.system}, {"role": "user", "content": a.task}]
        prev = await self.call(i, conv, CallKind.TURN, 0, None, messages, a.first_max_tokens)
        for t, turn in enumerate(a.turns, 1):
            if prev.error:
                return  # its history is unknown from here
            if turn.is_burst:
                messages = messages + await self.burst(i, conv, t, turn, prev, messages)
            else:
                await asyncio.sleep(turn.think_s)  # the tool runs
                call_id = f"call_{t}"
                messages = messages + [_assistant(prev.text, [(call_id, "read_file", {"path": turn.path})]),
                                       {"role": "tool", "tool_call_id": call_id, "content": self.trace.text(turn)}]
            prev = await self.call(i, conv, CallKind.TURN, t, prev, messages, turn.max_tokens)

    async def burst(self, i: int, conv: str, t: int, turn: Turn, parent: CallRecord,
                    messages: list[dict]) -> list[dict]:
        """The subagents, all at once, each forked from the parent's context (its history and last
        reply) with its own task; their answers become the results of the parent's tool calls."""
        base = messages + [{"role": "assistant", "content": parent.text}]
        subs = await asyncio.gather(*(
            self.call(i, f"{conv}-t{t}-sub{j}", CallKind.SUBAGENT, t, parent,
                      base + [{"role": "user", "content": s.task}], s.max_tokens)
            for j, s in enumerate(turn.subtasks)))
        ids = [f"call_{t}_{j}" for j in range(len(subs))]
        return ([_assistant(parent.text, [(cid, "spawn_subagent", {"task": s.task})
                                          for cid, s in zip(ids, turn.subtasks)])]
                + [{"role": "tool", "tool_call_id": cid, "content": r.text or "(no answer)"}
                   for cid, r in zip(ids, subs)])

    async def sample_kv(self, t0: float, done: asyncio.Event) -> None:
        while not done.is_set():
            try:
                kv = await self.side.kv()
            except Exception:  # a probe that failed once (a busy server) is a gap in the plot
                kv = None
            if kv is not None:
                self.out.kv.append((round(time.perf_counter() - t0, 3), kv[0], kv[1]))
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), self.kv_every_s)


def _assistant(text: str, calls: list[tuple[str, str, dict]]) -> dict:
    return {"role": "assistant", "content": text,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                           for cid, name, args in calls]}


async def replay(trace: Trace, side: Side, *, tag: str, kv_every_s: float = 0.5) -> Replay:
    """Every agent of `trace` at once on `side`; conversations are named `tag`-agent-i (a fresh
    tag per run, so nothing a run leaves behind looks like the next run's prefix)."""
    run = _Run(trace, side, tag, kv_every_s)
    done = asyncio.Event()
    t0 = time.perf_counter()
    sampler = asyncio.create_task(run.sample_kv(t0, done))
    try:
        await asyncio.gather(*(run.agent(i, a) for i, a in enumerate(trace.agents)))
    finally:
        run.out.makespan_s = time.perf_counter() - t0
        done.set()
        await sampler
    return run.out
