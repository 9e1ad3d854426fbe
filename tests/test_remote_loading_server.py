"""A server that is up but still loading (llama-server answers every path, /v1/models too, 503
"Loading model"; vLLM a 5xx while it starts) is not ready: alone, the engine fails restartably
naming the 503 (it said "the servers list no model; name one with --remote-model", and could not
be restarted); beside a ready server it takes no work until a probe gets its model list."""

from __future__ import annotations

from magnitude_tui.engine.events import EngineFailed
from scheduler.types import DoneReason
from tests.openai_stub import Script, StubServer
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)


def test_a_loading_server_alone_fails_the_engine_restartably_naming_the_503(run_client):  # noqa: F811
    with StubServer(Script(models_status=503)) as loading:
        run = run_client([loading.url])
        run.until(lambda: any(isinstance(e, EngineFailed) for e in run.events))
        (failed,) = [e for e in run.events if isinstance(e, EngineFailed)]
        assert failed.restartable and "503" in failed.message
        assert "--remote-model" not in failed.message


def test_a_loading_server_takes_no_work_until_it_is_ready(run_client):  # noqa: F811
    with StubServer(Script(models_status=503)) as loading, StubServer(Script(words=3)) as ready:
        run = run_client([loading.url, ready.url], probe_interval_s=0.2)
        assert run.ready().model == "stub-model"
        for rid in ("a", "b"):
            run.client.submit(chat(rid))
            final = run.final(rid)
            assert final.done_reason is DoneReason.STOP and final.remote.endpoint == ready.url
        assert not loading.requests  # a chat request would have met 503s and retries there
        loading.script.models_status = 200
        run.until(lambda: all(s.healthy for s in run.client.pool.statuses()))
