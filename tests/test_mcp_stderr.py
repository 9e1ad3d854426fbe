"""An MCP server's stderr (tests/mcp_servers/raw_faults.py's `noisy`): only its tail is kept, a failure quotes the tail and says how much of it was dropped, and a call's stderr offset holds after older bytes were dropped."""

from __future__ import annotations

import os
import re
import stat

import pytest

from magnitude_tui.agent.mcp_process import STDERR_KEEP
from tests.test_mcp_probe_faults import raw, started

pytestmark = pytest.mark.serial  # asserts on time: runs alone (make test)


def big_open_files(over: int) -> list[int]:
    """Sizes of the regular files this process holds open that are larger than `over` bytes."""
    sizes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(fd))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size > over:
            sizes.append(st.st_size)
    return sizes


async def test_a_chatty_server_keeps_only_its_stderr_tail_and_a_failure_says_what_was_dropped():
    servers = await started(raw("ok", timeout_s=1.0))
    try:
        server = servers.servers[0]
        # 3 MB of stderr in one call: answered (the pipe is read as it fills), and neither memory
        # nor a file holds it (a temporary file grew with it for the whole session).
        r = await server.call("noisy", {"bytes": 3_000_000, "last": "first call done"})
        assert r.ok and r.text == "noisy done", r.text
        assert big_open_files(1_000_000) == []
        # A call's failure quotes the tail of what the server said during it, and how much of that
        # is not kept.
        r = await server.call("noisy", {"bytes": 1_000_000, "last": "dying: out of cheese", "then": "crash"})
        assert not r.ok and "dying: out of cheese" in r.text, r.text
        said = re.search(r"; ([\d,]+) earlier bytes of it not kept\)", r.text)
        assert said is not None, r.text
        assert int(said.group(1).replace(",", "")) == 1_000_000 + len("dying: out of cheese\n") - STDERR_KEEP
        assert big_open_files(1_000_000) == []
        # Started again (the same log): a call that times out after all that noise quotes none of
        # it, its offset counted past the dropped bytes.
        r = await server.call("hang", {})
        assert not r.ok and "did not answer within 1 s" in r.text and "stderr" not in r.text, r.text
        r = await server.call("ok", {})
        assert r.ok and r.text == "ok done"
    finally:
        await servers.close()
