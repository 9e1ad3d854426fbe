"""Every chunk of one stream carries the same `created` (OpenAI: "Each chunk has the same
timestamp"); it was each chunk's own second, so a stream that crossed a second changed it."""

from __future__ import annotations

import json
import time as real_time

import httpx
import pytest

import magnitude_tui.serve.app as app_module
import magnitude_tui.serve.completion as completion_module
import magnitude_tui.serve.text_completion as text_module
from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server


class TickingTime:
    """`time` whose wall clock moves a second at every reading (the rest is the real module)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now

    def __getattr__(self, name: str):
        return getattr(real_time, name)


@pytest.fixture(scope="module")
def server():
    config = EngineConfig(BackendConfig("fake", n_ctx=2048, n_seq_max=4, reply="one two three four"), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        yield s


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
    ("/completions", {"prompt": "hi", "n": 2}),
])
def test_every_chunk_of_a_stream_has_one_created(server, monkeypatch, path, body):
    ticking = TickingTime()
    for module in (app_module, completion_module, text_module):
        monkeypatch.setattr(module, "time", ticking, raising=False)
    with httpx.stream("POST", server.base + path, timeout=30, json=body | {
            "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}}) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert len(chunks) > 4
    assert len({c["created"] for c in chunks}) == 1
    assert len({c["id"] for c in chunks}) == 1
