"""`magnitude-tui run --remote`: a remote server's refusal reaches the person running it in the
server's own words. The run's EngineHub replaced the error of every request that ended outside a
step report with serve's "the engine stopped while running this request" (what HTTP callers are
told when the local worker dies), and every remote request ends that way, so any refusal read as
an engine crash."""

from __future__ import annotations

import io
import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from magnitude_tui.agent.headless import RunOptions, run_on_client
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from magnitude_tui.serve.hub import WORKER_DIED, EngineHub
from scheduler.types import DoneReason, Phase

REFUSAL = "model 'x' is busy: out of device memory (try a smaller batch)"


class _Refusing:
    """Lists one model, answers every completion with a 503 in OpenAI's error shape."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._send(200, {"data": [{"id": "x"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                self._send(400, {"error": {"message": REFUSAL, "type": "invalid_request_error"}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_run_on_a_remote_engine_says_the_servers_refusal(tmp_path):
    server = _Refusing()
    out, err = io.StringIO(), io.StringIO()
    try:
        code = await run_on_client(RunOptions("say hi", tmp_path, json_out=True),
                                   RemoteClient(RemoteConfig((server.url,))), roles={}, out=out, err=err)
    finally:
        server.close()
    assert code == 1
    document = json.loads(out.getvalue())
    assert REFUSAL in document["error"] and WORKER_DIED not in document["error"]


def test_http_callers_are_still_told_only_that_the_engine_stopped():
    # serve's hub keeps the worker's own words (pid, signal, log path) from HTTP callers.
    import asyncio

    async def routed(hub: EngineHub) -> SeqUpdate:
        queue: asyncio.Queue = asyncio.Queue()
        hub._routes["r1"] = (queue, 0)
        hub.dispatch([replace(death, request_id="r1")])
        return (await queue.get())[1]

    death = SeqUpdate("r1", "s1", None, Phase.DONE, done_reason=DoneReason.ERROR,
                      error="the engine worker was killed by SIGKILL; native log: /tmp/x.log")
    assert asyncio.run(routed(EngineHub(object()))).error == WORKER_DIED
    assert asyncio.run(routed(EngineHub(object(), callers_see_errors=True))).error == death.error


async def test_run_warns_when_no_server_lists_the_remote_model(tmp_path):
    # The app and generate said so; run read past the notice and said nothing.
    server = _Refusing()
    out, err = io.StringIO(), io.StringIO()
    try:
        await run_on_client(RunOptions("say hi", tmp_path, json_out=True),
                            RemoteClient(RemoteConfig((server.url,), model="y")), roles={}, out=out, err=err)
    finally:
        server.close()
    assert "warning: --remote-model 'y' is not among the models listed" in err.getvalue()
    assert "lists 'x'" in err.getvalue()
