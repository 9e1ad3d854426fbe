"""Calls that one caller sends together (no `user`: every local client is `api@127.0.0.1`) each
get a conversation of their own and run side by side, and the room check counts each of them."""

from __future__ import annotations

import asyncio
import re

import httpx

from backend.factory import BackendConfig
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.serve.app import ServeOptions
from tests.serve_support import running_server


def _together(base: str, bodies: list[dict]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            return list(await asyncio.gather(*(http.post("/chat/completions", json=b) for b in bodies)))
    return asyncio.run(go())


def test_calls_sent_together_by_one_caller_get_sessions_of_their_own():
    # The route used to hand the call to a task before submitting it: a second handler that ran
    # meanwhile picked the same free session, and the engine ran the two calls one after the other.
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=8, reply="hello there"), policy="fixed:64")
    with running_server(config, ServeOptions(model_name="fake")) as s:
        sessions: list[str] = []
        submit = s.hub.submit

        def record(request, queue, tag=0, client_name=None):
            sessions.append(request.session_id)
            return submit(request, queue, tag, client_name)

        s.hub.submit = record  # type: ignore[method-assign]
        for n in (1, 2):
            sessions.clear()
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "n": n}
            replies = _together(s.base, [body] * 6)
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            first = [x for x in sessions if not re.search(r"-(prompt|c\d+)$", x)]  # each call's first choice
            assert len(first) == 6 and len(set(first)) == 6, sessions


def test_a_schema_too_slow_to_sample_is_the_callers_400_naming_it(monkeypatch):
    # The engine ends such a request before it writes anything (engine/sampling.py); a whole
    # reply answered it as a 500 generation_failed, while n > 1 (whose prompt request trips
    # first) answered 400: the same schema got two statuses.
    import magnitude_tui.engine.sampling as sampling

    monkeypatch.setattr(sampling, "MAX_MASK_MS", -1.0)  # every mask counts as too slow
    config = EngineConfig(BackendConfig("fake", n_ctx=4096, n_seq_max=8, reply='{"a": 1}'), policy="fixed:2")
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    with running_server(config, ServeOptions(model_name="fake")) as s:
        for n in (1, 2):
            r = httpx.post(s.base + "/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "n": n, "response_format": schema})
            assert r.status_code == 400, (n, r.text)
            error = r.json()["error"]
            assert error["param"] == "response_format" and "simplify the schema" in error["message"]
