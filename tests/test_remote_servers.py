"""The remote engine against real servers this project did not write, on the default model:
llama-cpp-python's own `llama_cpp.server` (runs wherever the package is, so in CI), and the
vendored `llama-server` built by scripts/build_llama_tools.sh (`make test` builds it first
and requires it; a bare pytest run where it is not built skips these with the command that builds
it). One server process per scenario group, short replies."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.needs import llama_tools, need_real_model  # noqa: E402

need_real_model()

from backend.llama_load import default_model_path  # noqa: E402
from magnitude_tui.engine.events import EndpointsReport  # noqa: E402
from magnitude_tui.remote.client import RemoteClient  # noqa: E402
from magnitude_tui.remote.config import RemoteConfig  # noqa: E402
from scheduler.types import DoneReason, ErrorKind, Message, Phase, Request, SamplingParams  # noqa: E402
from tests.app_support import SIZE, make_app, wait_for  # noqa: E402
from tests.remote_servers import llama_cpp_python_server, llama_server  # noqa: E402
from tests.test_remote_client import Run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

QUESTIONS = ("Name a colour.", "Name a fruit.", "Name an animal.", "Name a country.")


def chat(rid: str, text: str, max_tokens: int = 12) -> Request:
    return Request(rid, f"s-{rid}", (Message("user", text),), SamplingParams(max_tokens=max_tokens, seed=1))


def started(urls, **kw) -> Run:
    client = RemoteClient(RemoteConfig(tuple(urls), **kw))
    client.start()
    run = Run(client)
    run.ready()
    return run


# ---- llama-cpp-python's server (CI) -------------------------------------------------------------

@pytest.fixture(scope="module")
def py_server():
    with llama_cpp_python_server(default_model_path()) as server:
        yield server


def test_llama_cpp_server_streams_two_panes_with_estimated_counts(py_server):
    run = started([py_server.url])
    try:
        for i, q in enumerate(QUESTIONS[:2]):
            run.client.submit(chat(f"p{i}", q))
        finals = [run.final(f"p{i}", timeout=240) for i in range(2)]
        for i, f in enumerate(finals):
            text = "".join(u.text_delta for u in run.updates(f"p{i}"))
            assert f.error is None and f.done_reason in (DoneReason.STOP, DoneReason.LENGTH), f
            assert text.strip() and 0 < f.generated <= 12 + 2
            # This server sends no usage in a stream: the counts are tiktoken's, and say so.
            assert f.remote.tokens_estimated and f.prompt_total > 0
            assert f.ttft_ms > 0 and f.remote.endpoint == py_server.url
            phases = [u.phase for u in run.updates(f"p{i}")]
            assert Phase.WAITING in phases and Phase.PREFILL not in phases  # nothing invented
    finally:
        run.client.stop()


async def test_the_app_runs_a_pane_on_a_remote_server(py_server, tmp_path):
    client = RemoteClient(RemoteConfig((py_server.url,)))
    app = make_app(tmp_path, client)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        await wait_for(pilot, lambda: ws.engine_ready, timeout=60, what="the server")
        await pilot.press(*"Say hi.", "enter")
        pane = ws.grid.panes[0]
        await wait_for(pilot, lambda: pane.replies.last_update is not None
                       and pane.replies.last_update.phase is Phase.DONE,
                       timeout=240, what="the remote reply")
        assert pane.replies.last_update.error is None and pane.last_answer()
        assert pane.replies.last_update.remote.endpoint == py_server.url
        await wait_for(pilot, lambda: ws.scheduler_panel.endpoints is not None, what="the servers panel")
        assert ws.scheduler_panel.endpoints.endpoints[0].url == py_server.url


# ---- the vendored llama-server (where built) ----------------------------------------------------

def _tools():
    found = llama_tools()
    if found is None:
        pytest.skip("llama-server is not built here; scripts/build_llama_tools.sh --cpu builds it "
                    "(the llama-cpp-python server tests above run everywhere)")
    return found[0]


@pytest.fixture(scope="module")
def np4_server():
    with llama_server(_tools(), default_model_path(), parallel=4) as server:
        yield server


def _slots(server) -> list[dict]:
    with urllib.request.urlopen(server.url + "/slots", timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.serial
def test_llama_server_four_panes_stream_at_once_with_the_servers_usage(np4_server):
    run = started([np4_server.url])
    try:
        for i, q in enumerate(QUESTIONS):
            run.client.submit(chat(f"q{i}", q, max_tokens=16))
        # All four stream at once: each has text before any of them is done.
        run.until(lambda: all(any(u.phase is Phase.GENERATING for u in run.updates(f"q{i}")) for i in range(4))
                  or any(u.phase is Phase.DONE for i in range(4) for u in run.updates(f"q{i}")), timeout=240)
        assert all(any(u.phase is Phase.GENERATING for u in run.updates(f"q{i}")) for i in range(4))
        assert not any(u.phase is Phase.DONE for i in range(4) for u in run.updates(f"q{i}"))
        for i in range(4):
            f = run.final(f"q{i}", timeout=240)
            assert f.error is None and not f.remote.tokens_estimated
            # usage is the server's count; llama-server's own timings agree with it.
            assert f.remote.server_timings is not None and f.generated == f.remote.server_timings.predicted_n
            assert f.prompt_total == f.remote.server_timings.prompt_n + f.remote.server_timings.cache_n
    finally:
        run.client.stop()


def test_llama_server_cancel_frees_the_slot(np4_server):
    run = started([np4_server.url])
    try:
        run.client.submit(chat("long", "Write a very long story about the sea.", max_tokens=400))
        run.until(lambda: any(u.phase is Phase.GENERATING for u in run.updates("long")), timeout=240)
        assert any(s.get("is_processing") for s in _slots(np4_server))
        run.client.cancel("long")
        assert run.final("long").done_reason is DoneReason.CANCELLED
        deadline = time.monotonic() + 30
        while any(s.get("is_processing") for s in _slots(np4_server)):
            assert time.monotonic() < deadline, "the server slot stayed busy after the cancel"
            time.sleep(0.2)
    finally:
        run.client.stop()


def test_llama_server_refusing_a_prompt_over_its_context_is_a_context_length_error():
    # llama-server answers HTTP 400 with type exceed_context_size_error; the pane said only
    # "rejected the request", and an agent on it failed instead of cutting its tool results.
    with llama_server(_tools(), default_model_path(), parallel=1, n_ctx=256) as small:
        run = started([small.url])
        try:
            run.client.submit(chat("long", "hello world " * 300))
            f = run.final("long", timeout=120)
            assert f.done_reason is DoneReason.ERROR and f.error_kind is ErrorKind.CONTEXT_LENGTH, f.error
            assert "exceeds the available context size (256 tokens)" in f.error
            run.client.submit(chat("short", "Name a bird."))  # the server is fine: the next one fits
            assert run.final("short", timeout=120).error is None
            assert all(s.healthy for s in run.client.pool.statuses())
        finally:
            run.client.stop()


def test_two_llama_servers_share_the_panes_and_a_killed_one_fails_only_its_panes():
    bindir = _tools()
    with llama_server(bindir, default_model_path(), parallel=2) as one, \
            llama_server(bindir, default_model_path(), parallel=2) as two:
        run = started([one.url, two.url], max_in_flight=2)
        try:
            for i in range(4):
                run.client.submit(chat(f"k{i}", "Write a long story about a cat.", max_tokens=300))
            run.until(lambda: all(any(u.phase is Phase.GENERATING for u in run.updates(f"k{i}"))
                                  for i in range(4)), timeout=240)
            where = {f"k{i}": run.updates(f"k{i}")[-1].remote.endpoint for i in range(4)}
            assert sorted(where.values()) == sorted([one.url, one.url, two.url, two.url])
            one.kill()
            for rid, url in where.items():
                if url == one.url:
                    f = run.final(rid, timeout=60)
                    assert f.done_reason is DoneReason.ERROR and "mid-reply" in f.error
            for rid, url in where.items():
                if url == two.url:
                    run.client.cancel(rid)  # unaffected: still streaming (or done normally) until now
                    f = run.final(rid, timeout=60)
                    assert f.error is None and f.done_reason in (DoneReason.CANCELLED, DoneReason.STOP,
                                                                 DoneReason.LENGTH)
            run.client.submit(chat("after", "Name a bird."))
            after = run.final("after", timeout=240)
            assert after.error is None and after.remote.endpoint == two.url
            run.until(lambda: any(isinstance(e, EndpointsReport) and not e.endpoints[0].healthy
                                  for e in run.events))
        finally:
            run.client.stop()
