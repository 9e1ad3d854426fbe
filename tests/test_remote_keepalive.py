"""A server that closes a kept-alive connection as a request goes out on it (its idle keep-alive
timeout crossing the request: llama-server keeps an idle connection 5 s, `Keep-Alive: timeout=5`,
and httpx keeps one as long) is healthy: the request is sent once more, on a connection of its
own, to the same server. It was marked dead ("closed the connection without answering
(RemoteProtocolError)"), and with one server the pane failed. A server that also hangs up on a
fresh connection is still marked dead, after that one retry."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduler.types import DoneReason
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)

REPLY = "".join(f"data: {json.dumps(e)}\n\n" for e in (
    {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)) + "data: [DONE]\n\n"


class KeepAliveServer:
    """Keeps connections alive (every answer has a content-length; the /v1/models probe's too
    unless `keep_probe` is False). `hang_up(nth, method)` says whether to close the connection,
    unanswered, on its nth request (1: its first)."""

    def __init__(self, hang_up, keep_probe: bool = True, work_s: float = 0.0) -> None:
        self.posts = 0  # POST requests that reached the server
        self.hung_up = 0
        self.connections = 0
        this = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                self.nth = 0
                this.connections += 1

            def _answer(self, kind: str, body: bytes, close: bool = False) -> None:
                self.send_response(200)
                if close:
                    self.send_header("connection", "close")
                    self.close_connection = True
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _hang_up(self) -> bool:
                self.nth += 1
                if hang_up(self.nth, self.command):
                    this.hung_up += 1
                    self.close_connection = True  # closed without a byte of an answer
                    return True
                return False

            def do_GET(self) -> None:
                if not self._hang_up():
                    self._answer("application/json", b'{"data": [{"id": "m"}]}', close=not keep_probe)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                this.posts += 1
                time.sleep(work_s)  # working on it (then the hang-up is not a stale connection's)
                if not self._hang_up():
                    self._answer("text/event-stream", REPLY.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def keepalive():
    servers: list[KeepAliveServer] = []

    def make(hang_up, **kw) -> KeepAliveServer:
        servers.append(KeepAliveServer(hang_up, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_a_kept_alive_connection_the_server_closes_is_retried_and_the_server_stays_healthy(run_client, keepalive):  # noqa: F811
    # Every request after a connection's first finds it closed (the first turn goes out on the
    # /v1/models probe's connection).
    server = keepalive(lambda nth, method: nth > 1)
    run = run_client([server.url])
    run.ready()
    for rid in ("t1", "t2", "t3"):
        run.client.submit(chat(rid, session="s"))
        final = run.final(rid, timeout=10)
        assert final.error is None and final.done_reason is DoneReason.STOP, final.error
        assert "".join(u.text_delta for u in run.updates(rid)) == "hi"
    (status,) = run.client.pool.statuses()
    assert status.healthy and status.errors == 0
    # The first turn at least went out on a kept-alive connection (the probe's); each hang-up
    # cost one more request, on a new connection, and nothing else.
    assert server.hung_up >= 1 and server.posts == 3 + server.hung_up


def test_a_server_that_hangs_up_on_a_fresh_connection_too_is_marked_dead(run_client, keepalive):  # noqa: F811
    server = keepalive(lambda nth, method: method == "POST")
    run = run_client([server.url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.ERROR
    assert "closed the connection without answering" in final.error and "no server" in final.error
    (status,) = run.client.pool.statuses()
    assert not status.healthy
    assert server.posts == 2  # the kept-alive connection, then one fresh: no more


def test_a_hang_up_on_a_new_connection_is_not_retried(run_client, keepalive):  # noqa: F811
    # The probe's connection is closed after its answer: the request opens its own, and a hang-up
    # there marks the server dead at once, as before.
    server = keepalive(lambda nth, method: method == "POST", keep_probe=False)
    run = run_client([server.url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.ERROR and "closed the connection without answering" in final.error
    assert not run.client.pool.statuses()[0].healthy
    assert server.posts == 1


def test_a_server_that_took_the_request_and_then_hung_up_is_not_asked_again(run_client, keepalive):  # noqa: F811
    # The request went out on a kept-alive connection and the server worked on it before going
    # away: asking it again would run the completion twice (a review found the retry did).
    server = keepalive(lambda nth, method: method == "POST", work_s=1.0)
    run = run_client([server.url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.ERROR and "closed the connection without answering" in final.error
    assert server.posts == 1
