"""A client that hangs up while an n > 1 call evaluates its prompt (the seconds of prefill before
any choice exists) cancels that evaluation: it ran to its end, and its choices after it."""

from __future__ import annotations

import time

import httpx
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server, watching_cancels

LONG = [{"role": "user", "content": "word " * 1000}]  # 5,000 tokens: about 20 s of prefill

pytestmark = pytest.mark.serial  # asserts on time: runs alone (make test)


@pytest.fixture(scope="module")
def server():
    # Steps take their simulated time for real, so the long prompt's prefill lasts seconds.
    config = EngineConfig(BackendConfig("simulated:cpu2core", realtime=True, n_ctx=8192, n_seq_max=4),
                          policy="target:50")
    with running_server(config, ServeOptions(model_name="sim")) as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_hanging_up_during_an_n_calls_prompt_evaluation_cancels_it(server, stream):
    t0 = time.monotonic()
    with watching_cancels(server) as watch:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.base + "/chat/completions", timeout=0.3, json={
                "messages": LONG, "n": 2, "max_tokens": 50, "stream": stream, "user": f"gone-{stream}"})
    assert len(watch.cancelled) == 1 and watch.cancelled[0].endswith("-prompt"), watch.cancelled
    assert time.monotonic() - t0 < 3.0
    assert "cancelled" in server.log.getvalue().splitlines()[-1]
