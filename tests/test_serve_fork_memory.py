"""The engine remembers which conversation each fork started from, so an evicted subagent's next
turn reuses its parent's prefix again. It never forgot: every caller that forked a shared system
prompt (a new `user` per agent run) added an entry for good, and each eviction scanned them all
(8.8 ms at 200,000). Entries now go once both sides are gone, and at most MAX_GONE_FORKS whose
child was evicted are kept."""

from __future__ import annotations

import openai

import scheduler.residency as residency
from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.thread import serve_in_thread

SYSTEM = {"role": "system", "content": "You are a coding agent with tools. Be careful and concise. " * 3}


def test_forks_from_a_shared_system_prompt_are_not_remembered_for_good(monkeypatch):
    made: list[residency.Residency] = []
    init = residency.Residency.__init__

    def recording(self, *a, **kw) -> None:
        init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(residency.Residency, "__init__", recording)
    monkeypatch.setattr(residency, "MAX_GONE_FORKS", 8)
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64")
    with serve_in_thread(config, ServeOptions(model_name="f", max_live=32)) as server:
        client = openai.OpenAI(base_url=server.base, api_key="x", max_retries=0)
        for i in range(120):
            client.chat.completions.create(model="f", max_tokens=3, user=f"run-{i}",
                                           messages=[SYSTEM, {"role": "user", "content": f"task {i}"}])
        res = made[-1]
        forked = len(res.fork_parent)
        resident = sum(child in res.sessions for child in res.fork_parent)
    assert forked <= resident + 8, (forked, resident)
    assert forked < 40  # 119 before: one per caller
