"""Provides StubServer: a tiny OpenAI-compatible HTTP server whose answers a test scripts
(status codes, Retry-After, a malformed or broken stream, slow tokens), for the failure paths
that real servers cannot be made to show on demand. The happy paths are also tested against real
servers (tests/test_remote_servers.py)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Script:
    """How the stub answers chat requests; `statuses` are used up one per request first."""

    words: int = 5  # content deltas per reply
    delay_s: float = 0.0  # before each delta
    first_delay_s: float = 0.0  # before the first delta (a slow prefill, or a read timeout)
    usage: bool = True
    timings: bool = False
    cached_tokens: int | None = None
    statuses: list[tuple[int, dict, str]] = field(default_factory=list)  # (code, headers, body)
    malformed: bool = False  # send a line that is not JSON mid-stream
    break_after: int | None = None  # close the connection after this many deltas, without [DONE]
    models: tuple[str, ...] = ("stub-model",)
    models_status: int = 200
    models_delay_s: float = 0.0


class StubServer:
    def __init__(self, script: Script | None = None, port: int = 0) -> None:
        self.script = script or Script()
        self.requests: list[dict] = []
        self.open_streams = 0
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                s = stub.script
                time.sleep(s.models_delay_s)
                if self.path.rstrip("/").endswith("/models"):
                    body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in s.models]})
                    self._send(s.models_status, body)
                else:
                    self._send(404, json.dumps({"error": {"message": "not found"}}))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with stub.lock:
                    stub.requests.append({"body": body, "headers": dict(self.headers)})
                    scripted = stub.script.statuses.pop(0) if stub.script.statuses else None
                if scripted is not None:
                    code, headers, text = scripted
                    self._send(code, text, headers)
                    return
                self._stream(body)

            def _send(self, code: int, body: str, headers: dict | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _event(self, obj) -> None:
                payload = obj if isinstance(obj, str) else json.dumps(obj)
                self.wfile.write(f"data: {payload}\n\n".encode())
                self.wfile.flush()

            def _stream(self, body: dict) -> None:
                s = stub.script
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                n = min(s.words, body.get("max_tokens", s.words))
                with stub.lock:
                    stub.open_streams += 1
                try:
                    time.sleep(s.first_delay_s)
                    for i in range(n):
                        if s.break_after is not None and i == s.break_after:
                            return
                        if s.malformed and i == 1:
                            self.wfile.write(b"data: {not json\n\n")
                            self.wfile.flush()
                            return
                        time.sleep(s.delay_s)
                        self._event({"choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]})
                    final = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length" if n < s.words else "stop"}]}
                    if s.timings:
                        final["timings"] = {"prompt_n": 7, "prompt_ms": 14.0, "predicted_n": n,
                                            "predicted_ms": 10.0 * n, "cache_n": 3}
                    self._event(final)
                    if s.usage:
                        usage = {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}
                        if s.cached_tokens is not None:
                            usage["prompt_tokens_details"] = {"cached_tokens": s.cached_tokens}
                        self._event({"choices": [], "usage": usage})
                    self._event("[DONE]")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a cancel)
                finally:
                    with stub.lock:
                        stub.open_streams -= 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)  # port 0: any free one
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "StubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
