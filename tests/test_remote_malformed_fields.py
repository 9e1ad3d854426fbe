"""A server whose stream has fields of the wrong type, or whose Retry-After is neither seconds
nor a date: the pane fails with "malformed stream" (or the retry goes ahead), the engine goes on
serving, and counts that are not numbers fall back to estimates instead of failing the reply."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from magnitude_tui.remote.metrics import RemoteSeq
from scheduler.types import DoneReason, Message, Request, SamplingParams
from tests.openai_stub import Script, StubServer
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)

SSE = {"content-type": "text/event-stream"}
GOOD = b'data: {"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


class RawServer:
    """Answers each chat request with the next scripted (status, headers, body), then GOOD."""

    def __init__(self, answers: list[tuple[int, dict, bytes]]) -> None:
        self.answers = list(answers)
        self.posts = 0
        raw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                self._send(200, {}, b'{"data": [{"id": "m"}]}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                raw.posts += 1
                self._send(*(raw.answers.pop(0) if raw.answers else (200, SSE, GOOD)))

            def _send(self, code: int, headers: dict, body: bytes) -> None:
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def raw_server():
    servers: list[RawServer] = []

    def make(answers):
        servers.append(RawServer(answers))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.mark.parametrize("event", [
    b'{"choices":["x"]}',
    b'{"choices":[{"delta":"hi"}]}',
    b'{"choices":[{"delta":{"content":["a"]}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":5,"arguments":"{}"}}]},'
    b'"finish_reason":"tool_calls"}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":0,"id":7,"function":{"name":"f","arguments":"{}"}}]},'
    b'"finish_reason":"tool_calls"}]}',
])
def test_a_field_of_the_wrong_type_is_a_malformed_stream_and_the_engine_goes_on(run_client, raw_server, event):  # noqa: F811
    server = raw_server([(200, SSE, b"data: " + event + b"\n\ndata: [DONE]\n\n")])
    run = run_client([server.url])
    run.ready()
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)  # a tool name that was a number hung every pane before
    assert final.done_reason is DoneReason.ERROR and "malformed stream" in final.error
    run.client.submit(chat("b"))
    after = run.final("b", timeout=10)
    assert after.error is None and after.done_reason is DoneReason.STOP


def test_counts_that_are_not_numbers_leave_the_reply_with_estimates(run_client, raw_server):  # noqa: F811
    body = (b'data: {"choices":[{"delta":{"content":"hello"},"finish_reason":"stop"}],'
            b'"usage":{"prompt_tokens":null,"completion_tokens":"x"},"timings":{"predicted_n":null}}\n\n'
            b'data: [DONE]\n\n')
    server = raw_server([(200, SSE, body)])
    run = run_client([server.url])
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.STOP and final.error is None
    assert "".join(u.text_delta for u in run.updates("a")) == "hello"
    assert final.remote.tokens_estimated


def test_a_retry_after_that_is_neither_seconds_nor_a_date_is_still_retried(run_client, raw_server):  # noqa: F811
    server = raw_server([(503, {"Retry-After": "soon"}, b'{"error": {"message": "busy"}}')])
    run = run_client([server.url])
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.error is None and final.done_reason is DoneReason.STOP
    assert server.posts == 2


def test_a_request_whose_update_cannot_be_built_fails_alone(run_client, monkeypatch):  # noqa: F811
    real = RemoteSeq.update

    def update(self):
        if self.request.request_id == "bad":
            raise RuntimeError("boom")
        return real(self)

    monkeypatch.setattr(RemoteSeq, "update", update)
    with StubServer(Script(words=3)) as stub:
        run = run_client([stub.url])
        run.ready()
        run.client.submit(chat("bad"))
        final = run.final("bad", timeout=10)  # the flush loop died and every pane hung before
        assert final.done_reason is DoneReason.ERROR and "boom" in final.error
        run.client.submit(chat("good"))
        assert run.final("good", timeout=10).error is None
        time.sleep(0.3)  # the cancelled task's last mark has been flushed
        run.events.extend(run.client.poll_events(0.1) or [])
        assert sum(u.done_reason is not None for u in run.updates("bad")) == 1


def test_utf16_halves_in_a_stream_are_joined_or_u_fffd_and_the_history_can_be_sent_again(run_client, raw_server):  # noqa: F811
    # A server that cuts a character between two events sends each half as a \ud83d-style escape:
    # json.loads gives a str no encoder takes. Kept as is, the pane's next request (its history
    # sent back as JSON) failed with UnicodeEncodeError, and so did every one after it.
    body = (b'data: {"choices":[{"delta":{"content":"a\\ud83d"}}]}\n\n'
            b'data: {"choices":[{"delta":{"content":"\\ude00b \\ud83d\\ude00 \\ud800"},"finish_reason":"stop"}]}\n\n'
            b'data: [DONE]\n\n')
    server = raw_server([(200, SSE, body)])
    run = run_client([server.url])
    run.client.submit(chat("a"))
    final = run.final("a", timeout=10)
    assert final.done_reason is DoneReason.STOP and final.error is None
    text = "".join(u.text_delta for u in run.updates("a"))
    assert text == "a\U0001f600b \U0001f600 \ufffd"  # halves across two events make their character
    text.encode("utf-8")
    history = (Message("user", "a"), Message("assistant", text), Message("user", "again"))
    run.client.submit(Request("b", "s-a", history, SamplingParams(max_tokens=8)))
    after = run.final("b", timeout=10)
    assert after.error is None and after.done_reason is DoneReason.STOP
