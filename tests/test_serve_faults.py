"""`serve` as a process under faults: SIGTERM ends every stream explicitly and exits 0, a killed
worker is restarted, a model that cannot load ends the server non-zero with the reason."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx
import openai
import pytest

from tests.serve_support import serve_process, wait_until

# The fake engine at a 2-core CPU's pace (really sleeping its steps): a long reply stays in
# flight for tens of seconds. No speculation: accepted n-gram drafts would speed it up.
PACED = ("--backend", "simulated:cpu2core", "--spec", "off", "--ctx", "8192", "--parallel", "2")
LONG = 3000  # tokens: ~30 s or more at that pace


def _raw_stream(base: str, lines: list[str], started: threading.Event, max_tokens: int = LONG) -> None:
    """A streamed call through httpx; every `data:` line it receives, in order."""
    with httpx.stream("POST", base + "/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "raw"}], "max_tokens": max_tokens, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                lines.append(line[5:].strip())
                if '"content"' in line and line.count('"content": ""') == 0:
                    started.set()


def _worker_pid(server_pid: int) -> int:
    """The engine worker: the server's child that multiprocessing spawned (not its resource tracker)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and b"spawn_main" in cmdline:
            return int(entry.name)
    raise AssertionError("no engine worker found")


def test_sigterm_ends_every_live_stream_with_an_error_and_done_then_exits_0():
    with serve_process(*PACED, "--grace", "1") as server:
        raw: list[str] = []
        raw_started = threading.Event()
        reader = threading.Thread(target=_raw_stream, args=(server.base, raw, raw_started), daemon=True)
        reader.start()
        client = openai.OpenAI(base_url=server.base, api_key="none", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=LONG, stream=True)
        chunks = iter(stream)
        text = ""
        while not text:
            text += next(chunks).choices[0].delta.content or ""
        assert raw_started.wait(60)

        server.proc.send_signal(signal.SIGTERM)
        # The official client must not end its loop normally on a cut reply: it raises.
        with pytest.raises(openai.APIError, match="cut short"):
            for chunk in chunks:
                text += chunk.choices[0].delta.content or "" if chunk.choices else ""
        reader.join(30)
        assert not reader.is_alive()
        assert raw[-1] == "[DONE]"
        error = json.loads(raw[-2])["error"]
        assert "cut short" in error["message"]
        assert server.proc.wait(timeout=30) == 0
        assert "stopped (exit status 0)" in server.log
        assert "ended 2 requests still running after the grace period" in server.log
        # The cut replies' log lines keep their counts (the usage a client with include_usage gets).
        cut = [line for line in server.lines if "  error  prompt" in line]
        assert len(cut) == 2 and all(" 0 tokens" not in line for line in cut), cut
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.base + "/models", timeout=2)


@pytest.mark.parametrize("how", ["SIGTERM to the server", "ctrl+c to the process group"])
def test_a_stop_signal_lets_a_short_reply_finish_within_the_grace_period(how):
    with serve_process(*PACED, "--grace", "30") as server:
        client = openai.OpenAI(base_url=server.base, api_key="none", max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=60, stream=True)
        chunks = iter(stream)
        first = next(chunks)
        if how.startswith("SIGTERM"):
            server.proc.send_signal(signal.SIGTERM)
        else:  # a terminal's ctrl+c reaches the engine worker too, which must leave it to serve
            os.killpg(server.proc.pid, signal.SIGINT)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finish[-1] == "length" and first.choices[0].delta.role == "assistant"
        assert server.proc.wait(timeout=30) == 0
        assert "ended" not in server.log


def test_a_killed_worker_is_restarted_and_callers_never_see_its_pid_or_log_path():
    with serve_process(*PACED, "--max-restarts", "2") as server:
        raw: list[str] = []
        started = threading.Event()
        reader = threading.Thread(target=_raw_stream, args=(server.base, raw, started), daemon=True)
        reader.start()
        assert started.wait(60)
        worker = _worker_pid(server.proc.pid)
        os.kill(worker, signal.SIGKILL)
        reader.join(30)
        assert raw[-1] == "[DONE]"
        message = json.loads(raw[-2])["error"]["message"]
        assert str(worker) not in message and "log" not in message
        server.wait_for_line("serve: restarting the engine")

        def healthy() -> bool:
            r = httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
            if r.status_code != 200:
                body = r.text
                assert str(worker) not in body and "engine.log" not in body and "/" not in body
            return r.status_code == 200

        wait_until(healthy, timeout=60)
        assert _worker_pid(server.proc.pid) != worker
        reply = httpx.post(server.base + "/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "again"}], "max_tokens": 5})
        assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "length"
        assert "SIGKILL" in server.log  # the operator learns how it died


def test_a_worker_that_keeps_dying_ends_the_server_non_zero_after_the_restart_limit():
    with serve_process(*PACED, "--max-restarts", "1") as server:
        first = _worker_pid(server.proc.pid)
        os.kill(first, signal.SIGKILL)
        server.wait_for_line("serve: restarting the engine")
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5).status_code == 200,
                   timeout=60)
        os.kill(_worker_pid(server.proc.pid), signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1
        assert "giving up" in server.log


def test_an_engine_that_cannot_load_ends_the_server_non_zero_with_its_reason():
    with serve_process("--backend", "simulated:no-such-machine", ready=False) as server:
        assert server.proc.wait(timeout=60) == 1
        line = server.wait_for_line("the engine could not start")
        assert "unknown hardware profile 'no-such-machine'" in line
        assert "exited with code" not in server.log
