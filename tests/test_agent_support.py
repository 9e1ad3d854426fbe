"""Provides the agent tests' engine: a fake backend whose reply is scripted from each prompt, run in process behind an EngineHub (no tests here)."""

from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from typing import Callable

from backend.fake import IM_END, IM_START, FakeBackend
from backend.tools import ToolSyntax, call_text
from magnitude_tui.agent.engine_link import HubRunner
from magnitude_tui.engine.protocol import EngineTarget
from magnitude_tui.serve.hub import EngineHub
from tests.engine_driver import engine_for


def call(name: str, **args) -> str:
    """A reply that calls `name` (the generic format the fake backend's tool syntax parses)."""
    return call_text(ToolSyntax.GENERIC, name, json.dumps(args))


class ScriptedBackend(FakeBackend):
    """Answers each request with `script(prompt)`, the prompt's text as the model saw it (ChatML)."""

    def __init__(self, script: Callable[[str], str], **kw) -> None:
        super().__init__(n_ctx=kw.pop("n_ctx", 32768), n_seq_max=kw.pop("n_seq_max", 8), **kw)
        self.script = script
        self.prompts: list[str] = []
        self._replies: dict[int, str] = {}

    def prompt_text(self, seq_id: int) -> str:
        marks = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
        return "".join(marks.get(t, chr(t) if t >= 32 or t in (9, 10) else "") for t in self.kv_tokens(seq_id))

    def sample(self, seq_id: int, logit_row: int) -> int:
        if self._sampled.get(seq_id, 0) == 0:
            prompt = self.prompt_text(seq_id)
            self.prompts.append(prompt)
            self._replies[seq_id] = self.script(prompt)
        self.reply = self._replies[seq_id]
        self.eog_after = len(self.reply)
        return super().sample(seq_id, logit_row)


class InProcessClient:
    """Enough of an EngineClient for EngineHub: requests go straight to an in-process Engine,
    which `pump` steps on the event loop (no threads, a virtual clock)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.closed_sessions: list[str] = []

    @property
    def target(self) -> EngineTarget:
        return EngineTarget("scripted", "fake")

    def submit(self, request) -> None:
        self.engine.submit(request)

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)

    def close_session(self, session_id: str) -> None:
        self.closed_sessions.append(session_id)
        self.engine.close_session(session_id)


@asynccontextmanager
async def scripted_engine(script: Callable[[str], str], **kw):
    """(HubRunner, backend, client) over an in-process engine answering by `script`."""
    backend = ScriptedBackend(script, **kw)
    engine, _ = engine_for(backend, policy="fixed:256")
    client = InProcessClient(engine)
    hub = EngineHub(client)

    async def pump() -> None:
        while True:
            report = engine.step()
            if report is not None:
                hub.dispatch([report])
            await asyncio.sleep(0 if report is not None else 0.001)

    task = asyncio.create_task(pump())
    try:
        yield HubRunner(hub), backend, client
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def last_user(prompt: str) -> str:
    """The newest user turn of a ChatML prompt (a tool result, in the generic format, is one)."""
    head = "<|im_start|>user\n"
    return prompt.rsplit(head, 1)[-1].split("<|im_end|>", 1)[0]
