"""The remote engine's client against a scripted OpenAI-compatible server: routing, queueing,
metrics, usage and estimates, and every failure a pane must explain (refused, 401, 404, 429/5xx
with Retry-After, timeouts, a malformed or broken stream)."""

from __future__ import annotations

import socket
import time

import pytest

from magnitude_tui.engine.events import EndpointsReport, EngineFailed, EngineReady, SeqUpdate
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig, api_key_from_env
from magnitude_tui.remote.metrics import estimate_tokens
from magnitude_tui.remote.request import request_body
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.openai_stub import Script, StubServer


def chat(rid: str, text: str = "hello", max_tokens: int = 8, session: str | None = None) -> Request:
    return Request(rid, session or f"s-{rid}", (Message("user", text),), SamplingParams(max_tokens=max_tokens))


class Run:
    """A started client and everything it sent."""

    def __init__(self, client: RemoteClient) -> None:
        self.client = client
        self.events: list[object] = []

    def until(self, cond, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events: {self.events[-5:]}")
            batch = self.client.poll_events(0.05)
            if batch:
                self.events.extend(batch)

    def updates(self, rid: str) -> list[SeqUpdate]:
        return [e for e in self.events if isinstance(e, SeqUpdate) and e.request_id == rid]

    def final(self, rid: str, timeout: float = 20.0) -> SeqUpdate:
        self.until(lambda: any(u.phase is Phase.DONE for u in self.updates(rid)), timeout)
        return self.updates(rid)[-1]

    def ready(self) -> EngineReady:
        self.until(lambda: any(isinstance(e, (EngineReady, EngineFailed)) for e in self.events))
        event = next(e for e in self.events if isinstance(e, (EngineReady, EngineFailed)))
        assert isinstance(event, EngineReady), event
        return event


@pytest.fixture
def run_client():
    clients = []

    def make(urls, **kw) -> Run:
        client = RemoteClient(RemoteConfig(tuple(urls), **kw))
        clients.append(client)
        client.start()
        return Run(client)

    yield make
    for c in clients:
        c.stop()


def free_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_reply_streams_with_client_measured_figures_and_the_servers_usage(run_client):
    with StubServer(Script(words=6, delay_s=0.02, first_delay_s=0.2, cached_tokens=5)) as stub:
        run = run_client([stub.url])
        ready = run.ready()
        assert ready.model == "stub-model" and ready.policy == "server"
        run.client.submit(chat("a"))
        final = run.final("a")
        ups = run.updates("a")
        phases = [u.phase for u in ups]
        # Sent, then a slow first token: `waiting`, never an invented prefill.
        assert phases[0] in (Phase.QUEUED, Phase.WAITING) and Phase.WAITING in phases
        assert Phase.GENERATING in phases and Phase.PREFILL not in phases
        assert "".join(u.text_delta for u in ups) == "w0 w1 w2 w3 w4 w5 "
        assert final.done_reason is DoneReason.STOP
        assert (final.generated, final.prompt_total, final.cached_tokens) == (6, 11, 5)
        assert not final.remote.tokens_estimated
        assert final.remote.endpoint == stub.url
        assert final.ttft_ms >= 200 and final.itl_p50_ms >= 15 and final.tok_s > 0
        body = stub.requests[0]["body"]
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [{"role": "user", "content": "hello"}] and body["max_tokens"] == 8


def test_the_servers_panel_figures_are_its_requests_own(run_client):
    with StubServer(Script(words=20, delay_s=0.01, first_delay_s=0.25)) as stub:
        run = run_client([stub.url])
        run.ready()
        run.client.submit(chat("a", max_tokens=20))
        final = run.final("a")
        run.until(lambda: any(isinstance(e, EndpointsReport) and e.endpoints[0].ttft_p50_ms is not None
                              for e in run.events))
        [status] = [e for e in run.events if isinstance(e, EndpointsReport)][-1].endpoints
        # The server's TTFT is its requests' TTFT (it was recorded as 0 before the first token
        # had a time), and its rate counts what streamed over the last few seconds.
        assert status.ttft_p50_ms == status.ttft_p95_ms == pytest.approx(final.ttft_ms)
        assert status.ttft_p50_ms >= 250
        assert status.tok_s > 0 and status.errors == 0 and status.healthy


def test_without_usage_the_counts_are_tiktoken_estimates_marked_as_such(run_client):
    with StubServer(Script(words=4, usage=False, timings=True)) as stub:
        run = run_client([stub.url])
        run.client.submit(chat("a", text="count these words please"))
        final = run.final("a")
        assert final.remote.tokens_estimated
        assert final.generated == estimate_tokens("w0 w1 w2 w3 ")
        assert final.prompt_total > estimate_tokens("count these words please")
        assert final.remote.server_timings is not None and final.remote.server_timings.cache_n == 3
        assert final.cached_tokens == 3  # llama-server's cache_n stands in for cached_tokens


@pytest.mark.serial
def test_a_per_server_limit_queues_on_the_client_and_the_wait_is_queue_time(run_client):
    with StubServer(Script(words=10, delay_s=0.03)) as stub:
        run = run_client([stub.url], max_in_flight=1)
        run.ready()
        run.client.submit(chat("a"))
        run.client.submit(chat("b"))
        a, b = run.final("a"), run.final("b")
        assert any(u.phase is Phase.QUEUED and u.waiting_reason and "waiting for a slot" in u.waiting_reason
                   for u in run.updates("b"))
        assert b.queue_ms >= 0.8 * (a.ttft_ms + 7 * 30)  # b waited while a streamed
        assert a.queue_ms < 100


def test_new_work_goes_to_the_least_loaded_server(run_client):
    with StubServer(Script(words=30, delay_s=0.02)) as one, StubServer(Script(words=30, delay_s=0.02)) as two:
        run = run_client([one.url, two.url])
        run.ready()
        for rid in "abcd":
            run.client.submit(chat(rid, max_tokens=30))
        finals = [run.final(rid) for rid in "abcd"]
        used = [f.remote.endpoint for f in finals]
        assert used.count(one.url) == 2 and used.count(two.url) == 2
        run.until(lambda: any(isinstance(e, EndpointsReport) for e in run.events))
        # A conversation's next turn goes back to the server that holds its prefix, even when
        # that server is now the busier one.
        home = finals[0].remote.endpoint
        for i in range(3):
            run.client.submit(chat(f"x{i}", max_tokens=30))
        run.until(lambda: all(any(u.phase is Phase.GENERATING for u in run.updates(f"x{i}")) for i in range(3)))
        load = {url: sum(run.updates(f"x{i}")[-1].remote.endpoint == url for i in range(3))
                for url in (one.url, two.url)}
        assert load[home] == 2  # the first server is the busier one now
        run.client.submit(chat("a2", session="s-a"))
        assert run.final("a2").remote.endpoint == home


def test_refused_connection_marks_the_server_dead_and_work_goes_elsewhere(run_client):
    dead = free_port_url()
    with StubServer(Script(words=3)) as alive:
        run = run_client([dead, alive.url])
        run.ready()
        run.client.submit(chat("a"))
        final = run.final("a")
        assert final.error is None and final.remote.endpoint == alive.url
        run.until(lambda: any(isinstance(e, EndpointsReport) for e in run.events))
        report = [e for e in run.events if isinstance(e, EndpointsReport)][-1]
        status = {s.url: s for s in report.endpoints}
        assert not status[dead].healthy and "not reachable" in status[dead].last_error
        assert status[alive.url].healthy


def test_no_server_answering_fails_the_engine_with_a_restartable_error(run_client):
    url = free_port_url()
    run = run_client([url])
    run.client.submit(chat("a"))
    run.until(lambda: any(isinstance(e, EngineFailed) for e in run.events))
    failed = next(e for e in run.events if isinstance(e, EngineFailed))
    assert failed.restartable and "no server answered" in failed.message
    assert run.final("a").done_reason is DoneReason.ERROR
    assert not run.client.alive
    # The user starts the server and restarts (ctrl+r): the engine connects and work runs again.
    with StubServer(Script(words=3), port=int(url.rsplit(":", 1)[1])):
        run.client.restart()
        run.until(lambda: sum(isinstance(e, EngineReady) for e in run.events) == 1)
        assert run.client.alive
        run.client.submit(chat("b"))
        final = run.final("b")
        assert final.error is None and final.generated == 3 and final.remote.endpoint == url


@pytest.mark.parametrize("code, expect", [
    (401, "refused the API key"),
    (404, "does not serve model 'stub-model'"),
    (400, "rejected the request (400: context too long)"),
])
def test_refusals_fail_the_pane_with_what_to_do(run_client, code, expect):
    with StubServer(Script(statuses=[(code, {}, '{"error": {"message": "context too long"}}')])) as stub:
        run = run_client([stub.url])
        run.client.submit(chat("a"))
        final = run.final("a")
        assert final.done_reason is DoneReason.ERROR and expect in final.error
        assert len(stub.requests) == 1  # never retried


def test_429_and_503_are_retried_after_the_servers_retry_after(run_client):
    busy = '{"error": {"message": "busy"}}'
    with StubServer(Script(words=2, statuses=[(429, {"Retry-After": "0.3"}, busy), (503, {}, busy)])) as stub:
        run = run_client([stub.url])
        run.ready()
        t0 = time.monotonic()
        run.client.submit(chat("a"))
        final = run.final("a")
        assert final.error is None and final.generated == 2
        assert time.monotonic() - t0 >= 0.3
        assert len(stub.requests) == 3
        reasons = [u.waiting_reason for u in run.updates("a") if u.waiting_reason]
        assert any("answered 429" in r and "retrying in 0.3 s" in r for r in reasons)


def test_retries_are_bounded(run_client):
    busy = (503, {"Retry-After": "0"}, '{"error": {"message": "overloaded"}}')
    with StubServer(Script(statuses=[busy] * 10)) as stub:
        run = run_client([stub.url], max_retries=2)
        run.client.submit(chat("a"))
        final = run.final("a")
        assert "answered 503 (overloaded)" in final.error and "gave up after 2 retries" in final.error
        assert len(stub.requests) == 3


def test_a_silent_server_times_out_clearly(run_client):
    with StubServer(Script(first_delay_s=2.0)) as stub:
        run = run_client([stub.url], read_timeout_s=0.3)
        run.client.submit(chat("a"))
        final = run.final("a")
        assert "did not answer within 0.3 s (timeout)" in final.error


def test_a_malformed_stream_fails_that_pane_only(run_client):
    with StubServer(Script(words=5, malformed=True)) as bad, StubServer(Script(words=3)) as good:
        run = run_client([bad.url])
        other = run_client([good.url])
        run.client.submit(chat("a"))
        other.client.submit(chat("b"))
        assert "malformed stream" in run.final("a").error
        assert other.final("b").error is None


def test_a_stream_that_breaks_mid_reply_errors_and_the_server_is_avoided(run_client):
    with StubServer(Script(words=8, break_after=2, delay_s=0.01)) as flaky, StubServer(Script(words=3)) as good:
        run = run_client([flaky.url, good.url])
        run.ready()
        run.client.submit(chat("a"))
        first = run.final("a")
        assert first.done_reason is DoneReason.ERROR and first.remote.endpoint == flaky.url
        assert "mid-reply" in first.error
        for rid in "bc":  # new work goes to the other server while the first is suspect
            run.client.submit(chat(rid))
            assert run.final(rid).error is None


def test_an_empty_200_stream_says_so_and_the_server_stays_in_use(run_client):
    """llama-cpp-python's server answers a streamed prompt longer than its context with a 200 and
    no data. That read "ended mid-reply" and marked the server dead, though it had said nothing
    and was up."""
    with StubServer(Script(words=5, break_after=0)) as stub:
        run = run_client([stub.url])
        run.ready()
        run.client.submit(chat("a"))
        first = run.final("a")
        assert first.done_reason is DoneReason.ERROR
        assert "answered 200 with an empty stream" in first.error and "mid-reply" not in first.error
        assert all(s.healthy for s in run.client.pool.statuses())
        stub.script.break_after = None  # the next request fits: the same server answers it
        run.client.submit(chat("b"))
        assert run.final("b").error is None
        assert len(stub.requests) == 2


def test_cancel_closes_the_stream_and_frees_the_servers_slot(run_client):
    with StubServer(Script(words=500, delay_s=0.01)) as stub:
        run = run_client([stub.url], max_in_flight=1)
        run.client.submit(chat("a", max_tokens=500))
        run.until(lambda: any(u.phase is Phase.GENERATING for u in run.updates("a")))
        run.client.cancel("a")
        assert run.final("a").done_reason is DoneReason.CANCELLED
        run.until(lambda: stub.open_streams == 0)
        run.client.submit(chat("b"))  # the client's one slot is free again
        assert run.final("b").error is None


def test_api_key_goes_in_the_header_and_a_missing_variable_is_an_error(run_client, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sekrit")
    with StubServer(Script(words=1)) as stub:
        run = run_client([stub.url], api_key=api_key_from_env("STUB_KEY"))
        run.client.submit(chat("a"))
        run.final("a")
        assert stub.requests[0]["headers"]["Authorization"] == "Bearer sekrit"
    monkeypatch.delenv("STUB_KEY")
    with pytest.raises(ValueError, match="STUB_KEY"):
        api_key_from_env("STUB_KEY")


def test_config_checks_and_the_request_body():
    with pytest.raises(ValueError, match="at least one server"):
        RemoteConfig(())
    with pytest.raises(ValueError, match="not a server URL"):
        RemoteConfig(("localhost:8080",))
    body = request_body(Request("r", "s", (Message("system", "be brief"), Message("user", "hi")),
                                SamplingParams(temperature=0.5, seed=7, max_tokens=3)), "m")
    assert body["model"] == "m" and body["seed"] == 7 and body["temperature"] == 0.5
    assert [m["role"] for m in body["messages"]] == ["system", "user"]


def test_generate_runs_on_a_remote_server_and_says_its_figures_are_the_clients(capsys):
    from magnitude_tui.generate import run_generate

    with StubServer(Script(words=3, usage=False)) as stub:
        code = run_generate(["one", "two"], RemoteClient(RemoteConfig((stub.url,))), max_tokens=3,
                            temperature=0.0, seed=None, stream=False)
    out = " ".join(capsys.readouterr().out.split())  # the table may wrap at any width
    assert code == 0
    assert "client-side figures" in out and "estimated with tiktoken" in out
    n = estimate_tokens("w0 w1 w2 ")
    assert out.count(f"~{n}") >= 2  # each reply's tokens, counted here and marked


def test_the_generate_command_takes_the_remote_options(monkeypatch):
    from typer.testing import CliRunner

    from magnitude_tui.cli import app

    monkeypatch.setenv("STUB_KEY", "sekrit")
    with StubServer(Script(words=3, models=("a-model", "b-model"))) as one, \
            StubServer(Script(words=3, models=("a-model", "b-model"))) as two:
        result = CliRunner().invoke(app, ["generate", "hi", "--n", "4", "--max-tokens", "3",
                                          "--remote", one.url, "--remote", two.url + "/v1",
                                          "--remote-model", "b-model", "--api-key-env", "STUB_KEY"])
        assert result.exit_code == 0, result.output
        sent = one.requests + two.requests
    assert len(one.requests) == len(two.requests) == 2  # both servers share the four sequences
    assert {r["body"]["model"] for r in sent} == {"b-model"}
    assert {r["headers"]["Authorization"] for r in sent} == {"Bearer sekrit"}
    assert "client-side figures" in " ".join(result.output.split())
