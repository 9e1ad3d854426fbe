"""Transport failures below the stream: a connection reset with no message, a body whose
content-encoding does not decode. Each fails its pane saying what happened (never an empty
reason, never 'the remote client failed: DecodingError'), and a reset marks the server dead."""

from __future__ import annotations

import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from scheduler.types import DoneReason
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)


def _server(on_post):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:
                pass  # the reset this test asked for

        def do_GET(self) -> None:
            body = b'{"data": [{"id": "m"}]}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            on_post(self)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _reset(handler) -> None:
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.connection.close()
    handler.close_connection = True


def _not_gzip(handler) -> None:
    handler.rfile.read(int(handler.headers.get("content-length", 0)))
    body = b"data: this is not gzip\n\n"
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("content-encoding", "gzip")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def server():
    servers = []

    def make(on_post):
        servers.append(_server(on_post))
        return f"http://127.0.0.1:{servers[-1].server_address[1]}"

    yield make
    for s in servers:
        s.shutdown()
        s.server_close()


def test_a_reset_connection_says_what_happened_and_marks_the_server_dead(run_client, server):  # noqa: F811
    url = server(_reset)
    run = run_client([url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.ERROR
    # It said "broke mid-reply ()" before: the reason's text, empty, stood for the reason.
    assert "closed the connection without answering (ReadError)" in final.error
    (status,) = run.client.pool.statuses()
    assert not status.healthy


def test_a_body_that_does_not_decode_is_a_malformed_stream(run_client, server):  # noqa: F811
    url = server(_not_gzip)
    run = run_client([url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.ERROR
    assert "sent a malformed stream" in final.error and "does not decode" in final.error


def test_a_server_that_hangs_up_before_answering_hands_the_request_to_another(run_client, server):  # noqa: F811
    from tests.openai_stub import Script, StubServer

    dying = server(_reset)
    with StubServer(Script(words=3)) as good:
        run = run_client([dying, good.url])
        run.ready()
        run.client.submit(chat("a"))  # ties go to the first listed: the one that hangs up
        final = run.final("a", timeout=10)
        assert final.error is None and final.done_reason is DoneReason.STOP
        assert final.remote.endpoint == good.url
        dead = [s for s in run.client.pool.statuses() if s.url == dying]
        assert not dead[0].healthy
