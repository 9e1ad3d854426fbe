"""`serve` refusals: every error of the table answered in the OpenAI shape while a good call
streams to its end beside it, and the security defaults (the bind rule, nothing on disk served)."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from backend.factory import BackendConfig
from backend.fake import DEFAULT_REPLY
from magnitude_tui.cli import app as cli_app
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions, create_app
from magnitude_tui.serve.hub import EngineState
from magnitude_tui.serve.server import API_KEY_ENV, ServeConfigError, check_bind, resolve_api_key
from tests.serve_support import running_server

FAKE = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=16), policy="fixed:64")
KEY = {"Authorization": "Bearer right-key"}
JSON_KEY = {**KEY, "Content-Type": "application/json"}
HI = [{"role": "user", "content": "hi"}]
GOOD_TOKENS = 3500  # a second or more on the fake engine: long enough to stay in flight


@pytest.fixture(scope="module")
def server():
    # Two requests in flight at most: a call asking for n = 3 is refused whatever else is in flight
    # (a 400 naming `n`: no retry could take it). The 429 of a full queue depends on the calls in
    # flight (with n = 2 here it leaned on the good call still streaming, and the fake engine can
    # finish its 3,500 tokens first: 2 failures in about 40 runs): test_serve_fake.py, on a stub hub.
    with running_server(FAKE, ServeOptions(model_name="fake-model", api_key="right-key", max_live=2)) as s:
        yield s


def _refusals(base: str) -> list[tuple[str, dict, int, str, str | None]]:
    """(what, request kwargs, status, code, param): the error table."""
    return [
        ("n over --max-queue", dict(json={"messages": HI, "n": 3}, headers=KEY), 400, "invalid_value", "n"),
        ("no key", dict(json={"messages": HI}), 401, "invalid_api_key", None),
        ("wrong key", dict(json={"messages": HI}, headers={"Authorization": "Bearer nope"}), 401,
         "invalid_api_key", None),
        ("bad parameter", dict(json={"messages": HI, "top_p": 3}, headers=KEY), 400, "invalid_value", "top_p"),
        ("prompt over the context", dict(json={"messages": [{"role": "user", "content": "x" * 5000}]},
                                         headers=KEY), 400, "context_length_exceeded", "messages"),
        ("prompt over the context, streamed", dict(json={"messages": [{"role": "user", "content": "x" * 5000}],
                                                         "stream": True}, headers=KEY),
         400, "context_length_exceeded", "messages"),
        ("malformed JSON", dict(content=b"{nope", headers=JSON_KEY), 400, "invalid_json", None),
        ("body over the limit", dict(content=b"x" * (5 * 2**20), headers=JSON_KEY), 413, "body_too_large", None),
    ]


def test_every_refusal_is_openai_shaped_while_a_good_call_streams_to_its_end(server):
    text = []
    logged = len(server.log.getvalue().splitlines())
    with httpx.stream("POST", server.base + "/chat/completions", headers=KEY, timeout=60, json={
            "messages": [{"role": "user", "content": "the good call"}], "max_tokens": GOOD_TOKENS,
            "stream": True}) as good:
        lines = good.iter_lines()
        while not text:  # in flight: its first text has arrived
            line = next(lines)
            if line.startswith("data: {"):
                text.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        assert server.hub.num_live == 1
        for what, kwargs, status, code, param in _refusals(server.base):
            r = httpx.post(server.base + "/chat/completions", timeout=30, **kwargs)
            assert r.status_code == status, (what, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "code", "param"} and err["message"], what
            assert (err["code"], err["param"]) == (code, param), what
            if status == 429:
                assert r.headers["retry-after"] == "1"
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    text += [(e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices")]
    assert "".join(text) == (DEFAULT_REPLY * (GOOD_TOKENS // len(DEFAULT_REPLY) + 1))[:GOOD_TOKENS]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    # The headless log has a line for each refusal (who, status, code, why) and for the good call.
    lines = server.log.getvalue().splitlines()[logged:]
    refused = [line for line in lines if " refused " in line]
    assert [line.split(" refused ")[1].split(":")[0] for line in refused] == \
        [f"{status} {code}" for _, _, status, code, _ in _refusals(server.base)]
    assert all("api@127.0.0.1" in line for line in refused)
    assert any("  ok  " in line and f"{GOOD_TOKENS} tokens" in line for line in lines)


class _LoadingHub:
    state, num_live, failure, load_fraction, context_per_sequence = EngineState.LOADING, 0, None, 0.42, 4096
    draining = supervised = False


async def test_health_is_503_with_the_reason_while_the_model_loads():
    api = create_app(_LoadingHub(), ServeOptions())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        r = await c.get("/health")
    assert r.status_code == 503 and r.headers["retry-after"] == "2"
    err = r.json()["error"]
    assert err["code"] == "model_loading" and "loading (42%)" in err["message"]


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/", "/static/x", "/../../etc/passwd",
                                  "/v1/../../../etc/passwd", "/pyproject.toml"])
def test_nothing_on_disk_is_served(server, path):
    r = httpx.get(server.url + path, headers=KEY)
    assert r.status_code == 404
    assert "[project]" not in r.text and "root:" not in r.text


async def test_an_unknown_path_or_method_is_answered_in_the_openai_shape():
    api = create_app(_LoadingHub(), ServeOptions())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        missing = await c.post("/v1/chat/completion", json={})
        wrong = await c.get("/v1/chat/completions")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert "/v1/chat/completion" in missing.json()["error"]["message"]
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in wrong.headers["allow"]


@pytest.mark.parametrize("host, key, ok", [
    ("127.0.0.1", None, True), ("localhost", None, True), ("::1", None, True), ("127.0.0.2", None, True),
    ("0.0.0.0", None, False), ("192.168.1.5", None, False), ("::", None, False), ("example.org", None, False),
    ("0.0.0.0", "k", True),
])
def test_only_loopback_may_be_bound_without_a_key(host, key, ok):
    if ok:
        check_bind(host, key)
    else:
        with pytest.raises(ServeConfigError, match="--api-key"):
            check_bind(host, key)


def test_the_key_comes_from_the_flag_or_the_environment(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert resolve_api_key(None) is None and resolve_api_key("flag") == "flag"
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert resolve_api_key(None) == "from-env" and resolve_api_key("flag") == "flag"


def test_serve_refuses_a_public_address_without_a_key_before_loading_anything(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    result = CliRunner().invoke(cli_app, ["serve", "--host", "0.0.0.0", "--port", "9"])
    assert result.exit_code == 2
    assert "without an API key" in result.output and "--api-key" in result.output


class _RefusingClient:
    def submit(self, request):
        raise RuntimeError("the engine went away")


async def test_a_request_that_was_never_sent_does_not_count_as_in_flight():
    import asyncio

    from textual.dom import check_identifiers

    from magnitude_tui.serve.hub import EngineHub
    from scheduler.types import Message, Request, SamplingParams

    hub = EngineHub(_RefusingClient())
    session = hub.session_for("api@10.0.0.7")
    assert "-api_10_0_0_7-" in session
    check_identifiers("id", f"pane-{session}")  # a valid widget id: it names the caller's pane
    request = Request("r1", session, (Message("user", "hi"),), SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError):
        hub.submit(request, asyncio.Queue(), client_name="api@10.0.0.7")
    assert hub.num_live == 0 and hub.session_for("api@10.0.0.7") == session


def test_callers_whose_names_differ_only_in_replaced_characters_keep_their_own_conversations():
    # Session ids keep ASCII letters, digits, '-' and '_' (they name panes); two callers whose names
    # differ only in what is replaced must still not share one conversation, nor under --serve one
    # pane (the second caller's messages were added to the first caller's pane).
    from textual.dom import check_identifiers

    from magnitude_tui.serve.hub import EngineHub

    hub = EngineHub(_RefusingClient())
    names = ["张三", "李四", "a.b", "a_b", "api@10.0.0.7", "x" * 40 + "1", "x" * 40 + "2", "alice"]
    sessions = [hub.session_for(name) for name in names]
    assert len(set(sessions)) == len(names), sessions
    for session in sessions:
        check_identifiers("id", f"pane-{session}")
    assert sessions[-1].endswith("-alice")  # a name kept whole is its own slug
    assert hub.session_for("张三") == sessions[0]  # the same caller, the same conversation
