"""A prompt too long for a remote server's context ends its request with ErrorKind.CONTEXT_LENGTH,
as it does on the local engine, so an agent on a remote engine halves its newest tool results and
asks again (agent/loop.py). The remote client said only "rejected the request (400: ...)", no
kind: the agent's run failed on the first big tool result.

Servers say it their own ways: llama-server answers HTTP 400 `type: exceed_context_size_error`
(the body below is the one the vendored llama-server sent for a 631-token prompt at -c 256; the
real server is asked in tests/test_remote_servers.py), OpenAI and this project's `serve`
`code: context_length_exceeded`, vLLM a message "maximum context length". (llama-cpp-python's
server says it only without streaming: a streamed request over its context gets a 200 and an
empty stream, which the client reports as such, tests/test_remote_client.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from backend.factory import BackendConfig
from magnitude_tui.agent.engine_link import HubRunner
from magnitude_tui.agent.events import EndReason
from magnitude_tui.agent.team import AgentTeam
from magnitude_tui.agent.workspace import Workspace
from magnitude_tui.agents import AgentSettings
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from magnitude_tui.remote.stream import ServerError, parse_chunk
from magnitude_tui.serve.app import ServeOptions
from magnitude_tui.serve.hub import EngineHub, EngineState
from magnitude_tui.serve.thread import serve_in_thread
from scheduler.types import DoneReason, ErrorKind
from tests.openai_stub import Script, StubServer
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)


def llama_server_body(n_prompt: int, n_ctx: int) -> str:
    """llama-server's answer (HTTP 400) to a prompt over its context, as it sends it."""
    return json.dumps({"error": {"code": 400, "message": f"request ({n_prompt} tokens) exceeds the available context "
                                                         f"size ({n_ctx} tokens), try increasing it",
                                 "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": n_ctx}})


OPENAI = json.dumps({"error": {"message": "This model's maximum context length is 256 tokens. However, your "
                               "messages resulted in 631 tokens.", "type": "invalid_request_error",
                               "param": "messages", "code": "context_length_exceeded"}})
VLLM = json.dumps({"object": "error", "message": "This model's maximum context length is 256 tokens. However, you "
                   "requested 631 tokens in the messages, Please reduce the length of the messages.",
                   "type": "BadRequestError", "param": None, "code": 400})


@pytest.mark.parametrize("body", [llama_server_body(631, 256), OPENAI, VLLM], ids=["llama-server", "openai", "vllm"])
def test_a_prompt_over_the_servers_context_is_a_context_length_error(run_client, body):  # noqa: F811
    with StubServer(Script(statuses=[(400, {}, body)])) as stub:
        run = run_client([stub.url])
        run.ready()
        run.client.submit(chat("a"))
        final = run.final("a")
    assert final.done_reason is DoneReason.ERROR and final.error_kind is ErrorKind.CONTEXT_LENGTH
    assert "does not fit the server's context (400: " in final.error and "631" in final.error
    assert len(stub.requests) == 1  # not retried: the same prompt would not fit either


def test_another_400_is_no_context_length_error(run_client):  # noqa: F811
    body = json.dumps({"error": {"message": "temperature must be positive", "type": "invalid_request_error"}})
    with StubServer(Script(statuses=[(400, {}, body)])) as stub:
        run = run_client([stub.url])
        run.ready()
        run.client.submit(chat("a"))
        final = run.final("a")
    assert final.done_reason is DoneReason.ERROR and final.error_kind is None
    assert "rejected the request (400: temperature must be positive)" in final.error


def test_an_in_stream_context_error_says_so():
    with pytest.raises(ServerError) as caught:
        parse_chunk(llama_server_body(631, 256))
    assert caught.value.context_exceeded
    with pytest.raises(ServerError) as other:
        parse_chunk(json.dumps({"error": {"message": "the slot was lost"}}))
    assert not other.value.context_exceeded


def test_serve_refusing_a_prompt_too_long_is_a_context_length_error(run_client):  # noqa: F811
    # This project's own serve, on the fake backend (a token a character) with a 256-token context.
    config = EngineConfig(BackendConfig("fake", n_ctx=256, n_seq_max=1, reply="hi"), policy="fixed:64")
    with serve_in_thread(config, ServeOptions(model_name="fake-model")) as server:
        run = run_client([server.url])
        run.ready()
        run.client.submit(chat("a", "x" * 600))
        final = run.final("a", timeout=30)
    assert final.done_reason is DoneReason.ERROR and final.error_kind is ErrorKind.CONTEXT_LENGTH, final.error


# ---- an agent on a remote engine --------------------------------------------------------------

class _LlamaLike:
    """Answers like llama-server with a context of `n_ctx` tokens (a token per four characters of
    the messages): the first turn calls read_file on big.txt; a prompt over the context gets
    llama-server's 400; one that fits is answered."""

    def __init__(self, n_ctx: int) -> None:
        self.n_ctx = n_ctx
        self.tool_results: list[int] = []  # the length of the tool result each request carried
        this = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200, b'{"data": [{"id": "llama"}]}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                this.answer(self, body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, handler, body: dict) -> None:
        messages = body["messages"]
        tool = [m for m in messages if m["role"] == "tool"]
        self.tool_results.append(len(tool[-1]["content"]) if tool else 0)
        n_prompt = sum(len(m.get("content") or "") for m in messages) // 4
        if n_prompt > self.n_ctx:
            handler._send(400, llama_server_body(n_prompt, self.n_ctx).encode())
            return
        if tool:
            delta = {"content": "it starts with line 00000"}
            finish = "stop"
        else:
            delta = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": "big.txt"})}}]}
            finish = "tool_calls"
        events = [{"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
                  {"choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": 5, "total_tokens": 0}}]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        handler._send(200, data.encode(), "text/event-stream")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


async def test_an_agent_on_a_remote_engine_cuts_a_tool_result_that_does_not_fit(tmp_path):
    (tmp_path / "big.txt").write_text("".join(f"line {i:05d}\n" for i in range(1200)))  # 13,200 characters
    server = _LlamaLike(n_ctx=1024)  # about 4,000 characters of messages fit
    client = RemoteClient(RemoteConfig((server.url,)))
    hub = EngineHub(client)
    client.start()
    pump = asyncio.create_task(hub.run())
    try:
        for _ in range(200):
            if hub.state is not EngineState.LOADING:
                break
            await asyncio.sleep(0.05)
        assert hub.state is EngineState.READY, hub.failure
        team = AgentTeam(HubRunner(hub), Workspace(tmp_path))
        out = await asyncio.wait_for(team.agent(AgentSettings(), name="main", session_id="main").run("the task"), 60)
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        await asyncio.to_thread(client.stop)
        server.close()
    # Without the kind the run failed on its second turn, the first big tool result.
    assert out.reason is EndReason.ANSWERED, out.error
    assert out.answer == "it starts with line 00000"
    first, *retried = server.tool_results[1:]
    assert first > 13_000 and retried and all(b < a for a, b in zip([first, *retried], retried))
    shown = next(m.content for m in out.messages if m.role == "tool")
    assert "line 00000" in shown and "characters cut: the whole result did not fit in the context]" in shown
