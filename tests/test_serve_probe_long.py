"""A session of agent-shaped traffic leaves nothing behind: after many callers (with and without
`user`), streamed and whole replies, n > 1, and clients that hang up mid-stream or mid-wait, the
hub holds no route, no live session and no update, the engine runs nothing, the server's open
files are back where they were, and a fixed small call still answers whole. (The 25-minute soak
this stands for, on the real model, is described in docs/design/serve.md.)"""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import httpx
import openai
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import recording, running_server, wait_until


@pytest.fixture(scope="module")
def server():
    # Real-time steps, so a client that reads one chunk and hangs up leaves a reply still running.
    config = EngineConfig(BackendConfig("simulated:cpu2core", realtime=True, n_ctx=4096, n_seq_max=8),
                          policy="target:50")
    with running_server(config, ServeOptions(model_name="sim", max_live=64)) as s:
        yield s


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def caller(server, k: int, seed: int, errors: list) -> None:
    rnd = random.Random(seed)
    client = openai.OpenAI(base_url=server.base, api_key="x", max_retries=0, timeout=60)
    try:
        for i in range(k):
            user = rnd.choice([None, f"agent-{seed}-{i}", f"agent-{seed}"])
            body: Any = {"model": "sim", "messages": [{"role": "system", "content": "You are an agent. " * 8},
                                                 {"role": "user", "content": f"task {seed} {i}"}],
                    "max_tokens": rnd.choice([4, 12, 40]), **({"user": user} if user else {})}
            kind = rnd.choice(["whole", "stream", "n", "hangup_stream", "hangup_whole"])
            if kind == "whole":
                r = client.chat.completions.create(**body)
                assert r.choices[0].finish_reason in ("stop", "length"), r
            elif kind == "stream":
                fins = [c.choices[0].finish_reason for c in client.chat.completions.create(**body, stream=True)
                        if c.choices and c.choices[0].finish_reason]
                assert fins and fins[-1] in ("stop", "length"), fins
            elif kind == "n":
                r = client.chat.completions.create(**body, n=2, stream=rnd.random() < 0.5)
                if isinstance(r, openai.Stream):
                    ended = {c.choices[0].index for c in r if c.choices and c.choices[0].finish_reason}
                    assert ended == {0, 1}, ended
                else:
                    assert [c.finish_reason in ("stop", "length") for c in r.choices] == [True, True], r
            elif kind == "hangup_stream":
                body["max_tokens"] = 200
                with httpx.stream("POST", server.base + "/chat/completions", json={**body, "stream": True},
                                  timeout=30) as resp:
                    for _ in zip(range(2), resp.iter_lines()):
                        pass
            else:
                body["max_tokens"] = 200
                with pytest.raises(httpx.TimeoutException):
                    httpx.post(server.base + "/chat/completions", json=body, timeout=0.2)
    except BaseException as e:  # reported by the test, not lost in a thread
        errors.append(e)
    finally:
        client.close()


def test_a_session_of_mixed_agent_traffic_leaves_nothing_behind(server):
    hub = server.hub
    before = open_files()
    errors: list = []
    with recording(server) as reports:
        threads = [threading.Thread(target=caller, args=(server, 10, seed, errors)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        # Every call, cancelled ones included, has had its last word, and the engine runs nothing.
        wait_until(lambda: not hub._routes and not hub._live_sessions and not hub._last, timeout=10)
        wait_until(lambda: reports and reports[-1].running == 0 and reports[-1].waiting == 0, timeout=10)
    assert hub.num_live == 0
    # Sockets closed by the clients are closed by the server too (keep-alive ends within 5 s).
    wait_until(lambda: open_files() <= before + 2, timeout=10)
    # A fixed small call still answers whole afterwards.
    r = openai.OpenAI(base_url=server.base, api_key="x", max_retries=0).chat.completions.create(
        model="sim", messages=[{"role": "user", "content": "hello"}], max_tokens=4, user="probe")
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None and r.usage.completion_tokens >= 1
    assert "Traceback" not in server.log.getvalue()
