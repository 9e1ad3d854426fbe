"""An MCP server's stdout as the SDK reads it (mcp_process.WholeLines): lines handed on whole, so a big result costs its size, not its size squared; a message over MAX_MESSAGE_BYTES is not held: the call it answers fails, said, and the server stays."""

from __future__ import annotations

import json
import time

import anyio
import pytest

from magnitude_tui.agent import mcp_process
from magnitude_tui.agent.mcp_process import WholeLines
from tests.test_mcp_probe_faults import raw, started


class Pieces:
    """A byte stream that hands out the given pieces, then ends."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.pieces:
            raise anyio.EndOfStream
        return self.pieces.pop(0)

    async def aclose(self) -> None:
        pass


async def read_all(*pieces: bytes) -> list[bytes]:
    stream, out = WholeLines(Pieces(*pieces)), []
    while True:
        try:
            out.append(await stream.receive())
        except anyio.EndOfStream:
            return out


async def test_pieces_are_handed_on_as_whole_lines():
    assert await read_all(b'{"a":', b"1}\n{", b'"b":2}\n{"c":3}\n{"d"', b":4}") == [
        b'{"a":1}\n', b'{"b":2}\n{"c":3}\n', b'{"d":4}']
    assert await read_all(b"x\n", b"", b"y\n") == [b"x\n", b"y\n"]


@pytest.mark.parametrize("order", ["python", "typescript", "none"])
async def test_a_line_over_the_bound_becomes_an_error_answer_to_its_request(monkeypatch, order):
    monkeypatch.setattr(mcp_process, "MAX_MESSAGE_BYTES", 1000)
    body = '"result": {"id": 99, "content": [{"type": "text", "text": "%s", "id": 99}]}' % ("A" * 5000)
    line = {"python": '{"jsonrpc": "2.0", "id": 7, %s}' % body,
            "typescript": '{%s, "jsonrpc": "2.0", "id": 7}' % body,
            "none": '{"jsonrpc": "2.0", "method": "notifications/x", "params": {"t": "%s"}}' % ("A" * 5000)}[order]
    data = (line + "\n" + '{"next": 1}\n').encode()
    pieces = [data[i:i + 300] for i in range(0, len(data), 300)]
    out = b"".join(await read_all(*pieces)).decode().splitlines()
    assert out[-1] == '{"next": 1}'  # the line after it is read as it came
    if order == "none":  # no request to answer: dropped
        assert out == ['{"next": 1}']
        return
    [answer] = [json.loads(x) for x in out[:-1]]
    assert answer["id"] == 7  # not the 99 inside the result
    assert answer["error"]["message"].startswith(f"the server's answer was {len(line):,} bytes, over the 1,000")


async def test_an_answer_over_the_bound_fails_its_call_and_the_server_stays(monkeypatch):
    monkeypatch.setattr(mcp_process, "MAX_MESSAGE_BYTES", 1024 * 1024)
    servers = await started(raw("ok"))
    try:
        server = servers.servers[0]
        pid = (await server.call("pid", {})).text
        r = await server.call("huge", {"bytes": 2 * 1024 * 1024})
        assert not r.ok and "over the 1,048,576 this client reads" in r.text and "started again" not in r.text, r.text
        assert servers.problems == {} and (await server.call("pid", {})).text == pid
        r = await server.call("huge", {"bytes": 1000 * 1000})  # under the bound: read
        assert r.ok and r.text.startswith("AAAA")
    finally:
        await servers.close()


@pytest.mark.serial
async def test_a_big_answer_costs_its_size_not_its_size_squared(monkeypatch):
    # 32 MiB in one line (the bound raised for it): the SDK's own reader took 6 s on the machine
    # this was written on (64 MiB: 29 s), joining its 64 KiB pieces one by one; whole, 0.35 s.
    monkeypatch.setattr(mcp_process, "MAX_MESSAGE_BYTES", 64 * 1024 * 1024)
    servers = await started(raw("ok", timeout_s=60))
    try:
        server = servers.servers[0]
        t0 = time.perf_counter()
        r = await server.call("huge", {"bytes": 32 * 1024 * 1024})
        took = time.perf_counter() - t0
        assert r.ok and r.text.startswith("AAAA") and took < 3.0, took
    finally:
        await servers.close()
