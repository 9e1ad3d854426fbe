"""Provides the `serve-faults` soak scenario: a real `serve` under an idle-connection flood, hostile
headers, a worker kill -9 and SIGTERM, with every stream ended explicitly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from magnitude_tui.local_server import free_port
from magnitude_tui.reliability.config import SoakConfig, soak_row
from magnitude_tui.serve.connections import raise_fd_limit

# The fake engine at a 2-core CPU's pace, really sleeping its steps: replies stay in flight.
PACED = ("--backend", "simulated:cpu2core", "--spec", "off", "--ctx", "8192", "--parallel", "4")
LONG = 3000
FLOOD = 1100  # idle connections: past the cap, and past a default 1,024 open-file limit
HEADER_TIMEOUT_S = 10.0  # serve's default (connections.ConnectionLimits)


class _Serve:
    """A `serve` subprocess and its log lines."""

    def __init__(self, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "magnitude_tui.cli", "serve", "--port", str(self.port),
                                      *PACED, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        stderr = self.proc.stderr
        assert stderr is not None  # stderr=PIPE
        self.reader = threading.Thread(target=lambda: self.lines.extend(l.rstrip("\n") for l in stderr), daemon=True)
        self.reader.start()
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            if any("[serve] ready" in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False

    def healthy(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)


class _Stream:
    """One streamed call read raw; `explicit` once it ended with a finish reason or an error, then [DONE]."""

    def __init__(self, url: str) -> None:
        self.lines: list[str] = []
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self.thread.start()

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", timeout=120, json={
                    "messages": [{"role": "user", "content": "soak"}], "max_tokens": LONG, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data:"):
                        self.lines.append(line[5:].strip())
                        if '"content": "' in line and '"content": ""' not in line:
                            self.started.set()
        except httpx.HTTPError as e:
            self.lines.append(f"transport error: {e}")

    @property
    def explicit(self) -> bool:
        if len(self.lines) < 2 or self.lines[-1] != "[DONE]":
            return False
        last = json.loads(self.lines[-2])
        return "error" in last or any(c.get("finish_reason") for c in last.get("choices", []))


def _worker_pid(server_pid: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == server_pid and b"spawn_main" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except (OSError, ValueError, IndexError):
                continue
    return None


def _streams(url: str, n: int, fails: list[str], what: str) -> list[_Stream]:
    streams = [_Stream(url) for _ in range(n)]
    if not all(s.started.wait(60) for s in streams):
        fails.append(f"{what}: a stream never started")
    return streams


def _ended(streams: list[_Stream], fails: list[str], what: str) -> int:
    for s in streams:
        s.thread.join(30)
    bad = sum(not s.explicit for s in streams)
    if bad:
        fails.append(f"{what}: {bad} of {len(streams)} streams not ended explicitly: "
                     f"{[s.lines[-2:] for s in streams if not s.explicit][:2]}")
    return bad


def _flood(server: _Serve, fails: list[str]) -> dict:
    """FLOOD idle connections (some half-open) beside live streams: the server stays reachable
    once the header timeout closes them, its log stays small, the streams keep flowing."""
    streams = _streams(server.url, 2, fails, "flood")
    log_before = sum(len(line) for line in server.lines)
    socks, refused = [], 0
    for i in range(FLOOD):
        try:
            s = socket.create_connection(("127.0.0.1", server.port), timeout=2)
        except OSError:
            refused += 1
            continue
        if i % 10 == 0:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
    sent = [len(s.lines) for s in streams]
    recovered = server.healthy(HEADER_TIMEOUT_S + 10)
    flowing = all(len(s.lines) > n for s, n in zip(streams, sent))
    for s in socks:
        s.close()
    log_bytes = sum(len(line) for line in server.lines) - log_before
    if not recovered:
        fails.append("flood: /health did not answer after the header timeout")
    if not flowing:
        fails.append("flood: a live stream stopped during the flood")
    if log_bytes > 20_000:
        fails.append(f"flood: the log grew {log_bytes:,} bytes")
    return {"streams": streams, "log_bytes": log_bytes, "refused_connect": refused}


def _hostile(server: _Serve, fails: list[str]) -> None:
    chat = server.url + "/v1/chat/completions"
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    deep = ('{"messages": ' + "[" * 5000 + "]" * 5000 + "}").encode()
    cases: list[tuple[str, dict[str, Any], int]] = [
        ("foreign Host", dict(json=hi, headers={"Host": "attacker.example"}), 400),
        ("cross-origin page", dict(json=hi, headers={"Origin": "https://evil.example"}), 403),
        ("text/plain POST", dict(content=json.dumps(hi).encode(), headers={"Content-Type": "text/plain"}), 415),
        ("nested JSON", dict(content=deep, headers={"Content-Type": "application/json"}), 400),
        ("forged user", dict(json={**hi, "user": "x\n[serve] forged\x1b[2J"}), 200),
    ]
    for what, kwargs, status in cases:
        got = httpx.post(chat, timeout=60, **kwargs).status_code
        if got != status:
            fails.append(f"hostile: {what} answered {got}, not {status}")
    if any(line.startswith("[serve] forged") or "\x1b" in line for line in server.lines):
        fails.append("hostile: a forged or escaped line reached the log")


def serve_faults(cfg: SoakConfig, progress) -> tuple[dict, list[str]]:
    raise_fd_limit()  # this process opens FLOOD sockets
    fails: list[str] = []
    t0 = time.monotonic()
    n_streams = unended = 0
    log_bytes = []
    for round_no in range(cfg.serve_rounds):
        progress(f"soak: serve-faults round {round_no + 1} of {cfg.serve_rounds}")
        server = _Serve("--grace", "1", "--max-restarts", "3")
        try:
            if not server.wait_ready():
                fails.append(f"round {round_no}: serve did not start: {server.lines[-3:]}")
                continue
            flood = _flood(server, fails)
            log_bytes.append(flood["log_bytes"])
            _hostile(server, fails)
            worker = _worker_pid(server.proc.pid)
            if worker is None:
                fails.append("kill: no worker found")
            else:
                os.kill(worker, signal.SIGKILL)
            streams = flood["streams"]
            unended += _ended(streams, fails, "kill")
            n_streams += len(streams)
            if not server.healthy(60):
                fails.append("kill: the engine did not come back")
            streams = _streams(server.url, 3, fails, "sigterm")
            server.proc.send_signal(signal.SIGTERM)
            unended += _ended(streams, fails, "sigterm")
            n_streams += len(streams)
            code = server.proc.wait(timeout=60)
            if code != 0:
                fails.append(f"sigterm: exit status {code}")
        finally:
            server.close()
    return soak_row("serve under faults", f"{cfg.serve_rounds} rounds, {time.monotonic() - t0:.0f} s", len(fails),
                    "-", f"{unended} of {n_streams} streams not ended explicitly",
                    flood_log_bytes_max=max(log_bytes, default=0)), fails
