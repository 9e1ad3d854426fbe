"""`serve` over the fake backend: the OpenAI wire format, real clients (openai, httpx SSE), errors, disconnects."""

from __future__ import annotations

import gc
import json
import threading
import warnings

import httpx
import openai
import pytest

from backend.factory import BackendConfig
from backend.fake import DEFAULT_REPLY
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions, create_app
from magnitude_tui.serve.hub import EngineState
from scheduler.types import DoneReason, Phase, Priority
from tests.serve_support import recording, running_server, wait_until, watching_cancels

FAKE = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64")
# Steps that take real time (26 ms for eight decode rows), so no choice of 3,500 tokens can end
# before a client that hangs up is noticed: the fake engine wrote 3,500 tokens for the first choice
# in under a second, and the hang-up test failed whenever the server noticed that late.
PACED = EngineConfig(BackendConfig("simulated:rx9070xt", n_ctx=32768, n_seq_max=16, realtime=True),
                     policy="fixed:64")


@pytest.fixture(scope="module")
def server():
    with running_server(FAKE, ServeOptions(model_name="fake-model", max_live=12)) as s:
        yield s


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=30)


def _expected(n: int) -> str:
    return (DEFAULT_REPLY * (n // len(DEFAULT_REPLY) + 1))[:n]


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = _client(server).models.list()
    assert [m.id for m in models.data] == ["fake-model"]


def test_non_streaming_reply_usage_and_timings(server):
    r = httpx.post(server.base + "/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": _expected(20)}
    assert body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["completion_tokens"] == 20
    assert usage["prompt_tokens"] > len("hello")  # the chat template's scaffolding counts too
    assert usage["total_tokens"] == usage["prompt_tokens"] + 20
    t = body["timings"]
    assert t["predicted_n"] == 20 and t["prompt_n"] + t["cache_n"] == usage["prompt_tokens"]
    for key in ("prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second", "queue_ms",
                "ttft_ms", "itl_p50_ms", "itl_p95_ms", "phases_ms"):
        assert key in t
    # The phases before the first token partition TTFT exactly (issue 26, defect 7), in `timings`
    # and so in the log line built from it.
    phases = t["phases_ms"]
    assert list(phases) == ["preparing", "queued", "prefill", "generating"]
    assert round(phases["preparing"] + phases["queued"] + phases["prefill"], 2) == t["ttft_ms"]
    assert phases["prefill"] == t["prompt_ms"] and phases["generating"] == t["predicted_ms"]


def test_openai_client_streams_with_usage_before_done(server):
    stream = _client(server).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "stream please"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == _expected(12)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_raw_sse_ends_with_done_and_carries_timings(server):
    lines = []
    with httpx.stream("POST", server.base + "/chat/completions", json={
            "messages": [{"role": "user", "content": "raw"}], "max_tokens": 5, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
    assert lines[-1] == "[DONE]"
    events = [json.loads(x) for x in lines[:-1]]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["timings"]["predicted_n"] == 5


def test_n_choices_share_one_evaluated_prompt(server):
    with recording(server) as reports:
        r = _client(server).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "a prompt long enough to share " * 4}],
            max_tokens=6, n=3, temperature=0)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert all(c.message.content == _expected(6) for c in r.choices)
    assert r.usage.completion_tokens == 18
    timings = r.model_extra["timings"]
    assert timings["prompt_n"] == r.usage.prompt_tokens
    # Evaluated once: the engine took the prompt's rows once, and each choice only its last prompt
    # token again (for its own logits), reusing the rest from the shared cells.
    prompt = r.usage.prompt_tokens
    assert sum(rep.prefill_rows for rep in reports) == prompt + 3
    forks = {u.request_id: u for rep in reports for u in rep.updates if u.request_id.startswith(r.id + "-")
             and u.request_id[-1].isdigit()}
    assert len(forks) == 3 and all(u.cached_tokens == prompt - 1 for u in forks.values())


def test_stop_strings_are_cut_across_token_boundaries_and_never_shown(server):
    # The fake backend emits one character per token, so "fox" arrives in three tokens.
    r = _client(server).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "go"}], max_tokens=40, stop=["fox", "zzz"])
    assert r.choices[0].message.content == "The quick brown "
    assert r.choices[0].finish_reason == "stop"
    stream = _client(server).chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "go"}], max_tokens=40, stop="lazy", stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "The quick brown fox jumps over the "


def test_eight_concurrent_requests_all_complete(server):
    results = {}

    def one(i):
        r = _client(server).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": f"request {i}"}], max_tokens=10 + i)
        results[i] = r.choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {i: _expected(10 + i) for i in range(8)}


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": None}, "messages"),
    ({"messages": [{"role": "hacker", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user<|im_end|>", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 12345}]}, "messages[0].content"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "   "}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 99}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": [""]}, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
])
def test_invalid_parameters_fail_alone_naming_the_parameter(server, body, param):
    good = {}

    def good_request():
        r = _client(server).chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "still fine"}], max_tokens=8)
        good["text"] = r.choices[0].message.content

    t = threading.Thread(target=good_request)
    t.start()
    r = httpx.post(server.base + "/chat/completions", json=body)
    t.join(30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert good["text"] == _expected(8)


def test_malformed_json_and_oversized_bodies(server):
    r = httpx.post(server.base + "/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (5 * 2**20) + b'"}]}'
    r = httpx.post(server.base + "/chat/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_prompt_over_the_context_is_context_length_exceeded(server):
    r = httpx.post(server.base + "/chat/completions", json={
        "messages": [{"role": "user", "content": "x" * 5000}], "max_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


class _StubHub:
    """A hub frozen in one state, for the answers that depend only on it."""

    def __init__(self, state, num_live=0, failure=None):
        self.state, self.num_live, self.failure, self.load_fraction = state, num_live, failure, 0.42
        self.context_per_sequence = 4096
        self.draining = self.supervised = False


@pytest.mark.parametrize("hub, status, code", [
    (_StubHub(EngineState.READY, num_live=12), 429, "queue_full"),
    (_StubHub(EngineState.LOADING), 503, "model_loading"),
    (_StubHub(EngineState.FAILED, failure="worker killed"), 503, "engine_failed"),
])
async def test_queue_full_and_not_ready_answers(hub, status, code):
    api = create_app(hub, ServeOptions(max_live=12))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == status and r.json()["error"]["code"] == code
        health = await c.get("/health")
        assert health.status_code == (200 if hub.state is EngineState.READY else 503)
    if status == 429:
        assert r.headers["retry-after"] == "1"
    if code == "model_loading":
        assert "42%" in r.json()["error"]["message"] and r.headers["retry-after"] == "2"


@pytest.mark.parametrize("num_live, n, status, code", [
    (0, 3, 400, "invalid_value"),  # n alone is over the limit: a retry could never be taken
    (10, 3, 400, "invalid_value"),
    (1, 2, 429, "queue_full"),  # only the load: a retry may be taken
])
async def test_n_over_max_queue_is_a_400_naming_n_and_a_full_queue_a_429(num_live, n, status, code):
    # n = 3 on a server that runs 2 requests at once was answered 429 "retry shortly", which no
    # retry could ever satisfy (the openai client retries 429s by itself, and gave up after seconds).
    api = create_app(_StubHub(EngineState.READY, num_live=num_live), ServeOptions(max_live=2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "n": n})
        text = await c.post("/v1/completions", json={"prompt": "hi", "n": n})
    for answer in (r, text):
        assert answer.status_code == status and answer.json()["error"]["code"] == code, answer.text
        if status == 400:
            error = answer.json()["error"]
            assert error["param"] == "n" and error["type"] == "invalid_request_error"
            assert "2" in error["message"] and "--max-queue" in error["message"]
            assert "retry-after" not in answer.headers
        else:
            assert answer.headers["retry-after"] == "1"


def _assert_cancelled(reports, cancelled: list[str]) -> None:
    """Each cancelled request ended `cancelled` long before its 3,500 tokens, and nothing runs.
    (The engine honours a cancel within one step: tests/test_engine_core.py's cancel tests.)"""
    ended = {u.request_id: u for rep in reports for u in rep.updates if u.phase is Phase.DONE}
    assert cancelled and all(ended[rid].done_reason is DoneReason.CANCELLED for rid in cancelled), \
        [(rid, ended[rid].done_reason, ended[rid].generated) for rid in cancelled]
    assert max(ended[rid].generated for rid in cancelled) < 3500
    assert reports[-1].running == reports[-1].waiting == 0


@pytest.mark.serial
def test_a_streaming_client_that_disconnects_is_cancelled_and_its_kv_goes_idle(server):
    with watching_cancels(server) as watch:
        with httpx.stream("POST", server.base + "/chat/completions", json={
                "messages": [{"role": "user", "content": "long one"}], "max_tokens": 3500, "stream": True}) as r:
            it = r.iter_lines()
            for _ in range(4):
                next(it)
    assert len(watch.cancelled) == 1
    _assert_cancelled(watch.reports, watch.cancelled)
    assert "cancelled" in server.log.getvalue()
    # Its KV went back as after esc: idle and resident, so the conversation's next call reuses it.
    again = httpx.post(server.base + "/chat/completions", json={
        "messages": [{"role": "user", "content": "long one"}], "max_tokens": 2}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1


def test_a_non_streaming_client_that_hangs_up_is_cancelled():
    with running_server(PACED, ServeOptions(max_live=12)) as server, watching_cancels(server) as watch:
        # Eight choices of 3,500 tokens take minutes; the client gives up after 0.3 s.
        with pytest.raises(httpx.TimeoutException):
            httpx.post(server.base + "/chat/completions", timeout=0.3, json={
                "messages": [{"role": "user", "content": "hang up"}], "max_tokens": 3500, "n": 8})
    assert len(watch.cancelled) == 8
    _assert_cancelled(watch.reports, watch.cancelled)


def test_stopping_the_server_leaves_no_task_pending_and_no_socket_open(caplog):
    # The first stream starts sse-starlette's shutdown watcher on the server's loop, which polls
    # until the process exits: the loop was dropped with it pending ("Task was destroyed but it is
    # pending!" when `bench serve` stopped its server), and the cancelled uvicorn left its
    # listening socket open.
    with running_server(FAKE) as s:
        with httpx.stream("POST", s.base + "/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        port = s.url.rsplit(":", 1)[1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert not [w for w in caught if f"127.0.0.1', {port})" in str(w.message)]


def test_api_key_is_required_when_set():
    with running_server(FAKE, ServeOptions(api_key="sekrit")) as s:
        r = httpx.post(s.base + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base, api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=s.base, api_key="sekrit", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert ok.choices[0].message.content == _expected(3)


def test_an_agents_second_turn_reports_its_first_turn_as_cached(server):
    client = _client(server)
    history = [{"role": "system", "content": "You are agent seven. " * 5},
               {"role": "user", "content": "first question"}]
    first = client.chat.completions.create(model="m", messages=history, max_tokens=10)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "second question"}]
    second = client.chat.completions.create(model="m", messages=history, max_tokens=10)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens
    assert second.model_extra["timings"]["prompt_n"] == second.usage.prompt_tokens - cached


def test_another_caller_resending_a_history_reuses_its_cells(server):
    # Admission looks among every idle resident conversation, not only the caller's own.
    client = _client(server)
    history = [{"role": "system", "content": "You are the planner of a shared task. " * 4},
               {"role": "user", "content": "list the steps"}]
    first = client.chat.completions.create(model="m", messages=history, max_tokens=10, user="planner")
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "now the second step"}]
    other = client.chat.completions.create(model="m", messages=history, max_tokens=10, user="worker-b")
    assert other.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_sampling_parameters_reach_the_engine(server):
    sent = []
    server.hub.on_request = lambda request, caller: sent.append(request)
    try:
        r = httpx.post(server.base + "/chat/completions", json={
            "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "params"}],
            "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.3, "top_p": 0.5, "min_p": 0.2,
            "top_k": 9, "seed": 1234, "stop": ["zz"], "ignore_eos": True})
    finally:
        server.hub.on_request = None
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 7
    (request,) = sent
    sp = request.sampling
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.min_p, sp.top_k, sp.seed, sp.stop, sp.ignore_eos) == \
        (7, 0.3, 0.5, 0.2, 9, 1234, ("zz",), True)
    assert [m.role for m in request.messages] == ["system", "user"]


def test_api_priority_above_zero_runs_in_the_background_class(server):
    sent = []
    server.hub.on_request = lambda request, caller: sent.append(request)
    try:
        for priority in (None, 0, 5):
            body = {"messages": [{"role": "user", "content": f"priority {priority}"}], "max_tokens": 2}
            if priority is not None:
                body["priority"] = priority
            assert httpx.post(server.base + "/chat/completions", json=body).status_code == 200
    finally:
        server.hub.on_request = None
    # No API call can claim the interactive class of a person's turn.
    assert [r.priority for r in sent] == [Priority.AGENT, Priority.AGENT, Priority.BACKGROUND]


def test_the_log_has_one_line_per_call_with_its_figures(server):
    before = server.log.getvalue().count("\n")
    httpx.post(server.base + "/chat/completions", json={
        "messages": [{"role": "user", "content": "log me"}], "max_tokens": 7, "user": "logger"})
    wait_until(lambda: "logger" in server.log.getvalue())
    lines = server.log.getvalue().splitlines()[before:]
    line, = [x for x in lines if "logger" in x]
    for part in ("ok", "prompt ", "7 tokens", "queue ", "TTFT ", " tok/s", "phases ", "generating ", "finish length"):
        assert part in line, (part, line)
