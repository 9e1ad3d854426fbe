"""`serve` against hostile clients: long histories refused (never trimmed silently), Host, Origin
and Content-Type checks, deeply nested JSON, forged log lines, silent and surplus connections."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.context import fit_conversation
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.connections import ConnectionLimits, QuietLog
from magnitude_tui.serve.guard import GuardPolicy, bound_hosts
from magnitude_tui.serve.server import printable
from scheduler.admission import ContextLengthError
from scheduler.types import Message
from tests.serve_support import recording, running_server, wait_until

FAKE = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64")
HI = [{"role": "user", "content": "hi"}]
LIMITS = ConnectionLimits(header_timeout_s=0.5, max_connections=6, keep_alive_s=0.5)


@pytest.fixture(scope="module")
def server():
    with running_server(FAKE, ServeOptions(model_name="fake-model"), limits=LIMITS) as s:
        yield s


def _chat(server, **kwargs) -> httpx.Response:
    return httpx.post(server.base + "/chat/completions", timeout=30, **kwargs)


# ---- 4: a history too long for the sequence is refused, not trimmed ----------------------------

def test_a_history_that_would_need_trimming_is_a_400_naming_messages(server):
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ab"[i % 2]} for i in range(2000)]
    with recording(server) as reports:
        r = _chat(server, json={"messages": history, "max_tokens": 4})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert "oldest messages are not dropped" in error["message"]
    assert not any(u.new_tokens for rep in reports for u in rep.updates)  # nothing was generated
    short = _chat(server, json={"messages": history[-3:], "max_tokens": 4})
    assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 4


def test_a_history_an_api_call_may_not_trim_is_refused_after_one_tokenization():
    # Searching for a cut renders the whole template each try, in the engine's thread (a 2,000-
    # message history took 1.6 s on a loaded 2-core machine, the bystanders' steps waiting).
    calls: list[int] = []

    def tokenize(messages):
        calls.append(len(messages))
        return [0] * (10 * len(messages))

    history = [Message("user" if i % 2 == 0 else "assistant", "x") for i in range(2000)]
    with pytest.raises(ContextLengthError, match="20,000 tokens"):
        fit_conversation(history, tokenize, 256, 64, may_drop=False)
    assert calls == [2000]
    assert fit_conversation(history, tokenize, 256, 64).dropped > 0 and len(calls) > 2  # a pane's trim


# ---- 6: Host, Origin, Content-Type ---------------------------------------------------------------

def test_a_foreign_host_name_is_refused_and_logged(server):
    r = _chat(server, json={"messages": HI, "max_tokens": 2}, headers={"Host": "attacker.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"
    assert "refused 400 host_not_allowed" in server.log.getvalue()
    port = server.url.rsplit(":", 1)[1]
    for name in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        assert httpx.get(server.base + "/models", headers={"Host": name}).status_code == 200


def test_a_cross_origin_browser_request_runs_nothing(server):
    with recording(server) as reports:
        r = _chat(server, json={"messages": HI, "max_tokens": 2}, headers={"Origin": "https://evil.example"})
        plain = _chat(server, content=json.dumps({"messages": HI, "max_tokens": 2}).encode(),
                      headers={"Content-Type": "text/plain;charset=UTF-8"})
        form = _chat(server, content=b"messages=hi", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert plain.status_code == 415 and plain.json()["error"]["code"] == "unsupported_media_type"
    assert form.status_code == 415
    assert not reports or not any(rep.updates for rep in reports)


def test_a_configured_origin_gets_cors_answers():
    guard = GuardPolicy(bound_hosts("127.0.0.1"), frozenset({"http://app.example"}))
    with running_server(FAKE, ServeOptions(guard=guard)) as s:
        pre = httpx.options(s.base + "/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://app.example"
        r = httpx.post(s.base + "/chat/completions", json={"messages": HI, "max_tokens": 2},
                       headers={"Origin": "http://app.example"}, timeout=30)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.post(s.base + "/chat/completions", json={"messages": HI, "max_tokens": 2},
                           headers={"Origin": "http://elsewhere.example"}, timeout=30)
        assert other.status_code == 403


def test_an_unexpected_failure_answers_a_configured_origin_with_cors_headers():
    # The 500 handler sat in Starlette's outermost middleware, outside CORS: a page allowed to
    # call got a 500 without Access-Control-Allow-Origin, which its browser hides from it.
    guard = GuardPolicy(bound_hosts("127.0.0.1"), frozenset({"http://app.example"}))
    with running_server(FAKE, ServeOptions(guard=guard)) as s:
        session_for = s.hub.session_for

        def broken(name: str) -> str:
            if name == "breaks":
                raise RuntimeError("a bug with /secret/path in its words")
            return session_for(name)

        s.hub.session_for = broken  # type: ignore[method-assign]
        origin = {"Origin": "http://app.example"}
        r = httpx.post(s.base + "/chat/completions", json={"messages": HI, "user": "breaks", "max_tokens": 2},
                       headers=origin, timeout=30)
        assert r.status_code == 500 and r.headers.get("access-control-allow-origin") == "http://app.example"
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "internal_error") and "secret" not in error["message"]
        ok = httpx.post(s.base + "/chat/completions", json={"messages": HI, "max_tokens": 2}, headers=origin,
                        timeout=30)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"


def test_bound_hosts_names_loopback_aliases_and_nothing_for_a_wildcard_bind():
    assert bound_hosts("127.0.0.1") >= {"127.0.0.1", "localhost", "::1"}
    assert bound_hosts("10.0.0.5", ("box.lan",)) == {"10.0.0.5", "box.lan"}
    assert bound_hosts("0.0.0.0") is None


# ---- 7: deeply nested JSON -------------------------------------------------------------------------

@pytest.mark.parametrize("depth", [5000, 100])
def test_deeply_nested_json_is_an_openai_shaped_400_logged_as_a_refusal(server, depth):
    body = ('{"messages": ' + "[" * depth + "]" * depth + "}").encode()
    r = _chat(server, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json" and "nests deeper" in r.json()["error"]["message"]
    assert "refused 400 invalid_json" in server.log.getvalue()
    assert "RecursionError" not in server.log.getvalue()


# ---- 8: the `user` field cannot forge log lines or send terminal escapes -------------------------

def test_the_user_field_is_escaped_in_the_log(server):
    user = "mallory\n[serve] chatcmpl-forged  admin  ok\x1b[2J\u2028"
    r = _chat(server, json={"messages": HI, "max_tokens": 2, "user": user})
    assert r.status_code == 200
    wait_until(lambda: "mallory" in server.log.getvalue())
    log = server.log.getvalue()
    assert "\x1b" not in log and "\u2028" not in log
    assert not any(line.startswith("[serve] chatcmpl-forged") for line in log.splitlines())
    assert "mallory\\n[serve] chatcmpl-forged" in log
    assert printable("x" * 500).endswith("...") and len(printable("x" * 500)) == 83


# ---- 5: silent, half-open and surplus connections --------------------------------------------------

def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(1024):
            pass
        return True
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_silent_and_half_open_connections_are_closed_after_the_header_timeout(server):
    port = int(server.url.rsplit(":", 1)[1])
    silent = socket.create_connection(("127.0.0.1", port))
    half = socket.create_connection(("127.0.0.1", port))
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        t0 = time.monotonic()
        assert _closed_by_server(silent, 10) and _closed_by_server(half, 10)
        assert time.monotonic() - t0 < 5
    finally:
        silent.close()
        half.close()
    assert _chat(server, json={"messages": HI, "max_tokens": 2}).status_code == 200


def test_connections_past_the_cap_are_answered_503_and_closed(server):
    port = int(server.url.rsplit(":", 1)[1])
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(LIMITS.max_connections)]
    try:
        # Accepted in order: this one is past the cap whenever the server gets to it.
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(5)
        answer = extra.recv(4096)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
    finally:
        for s in held:
            s.close()
    wait_until(lambda: _chat(server, json={"messages": HI, "max_tokens": 2}).status_code == 200)


def test_quiet_log_writes_a_burst_then_counts_the_rest():
    now = [0.0]
    out: list[str] = []
    quiet = QuietLog(out.append, burst=3, window_s=1.0, clock=lambda: now[0])
    for i in range(1000):
        quiet(f"line {i}")
    now[0] = 1.5
    quiet("after")
    assert out == ["line 0", "line 1", "line 2", "997 more lines like these were not written", "after"]
