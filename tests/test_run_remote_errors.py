"""`magnitude-tui run --remote`: a remote server's refusal reaches the person running it in the
server's own words. The run's EngineHub replaced the error of every request that ended outside a
step report with serve's "the engine stopped while running this request" (what HTTP callers are
told when the local worker dies), and every remote request ends that way, so any refusal read as
an engine crash."""

from __future__ import annotations

import io
import json
from dataclasses import replace

from magnitude_tui.agent.headless import RunOptions, run_on_client
from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from magnitude_tui.serve.hub import WORKER_DIED, EngineHub
from scheduler.types import DoneReason, Phase
from tests.openai_stub import Script, StubServer

REFUSAL = "model 'x' is busy: out of device memory (try a smaller batch)"


def _refusing() -> StubServer:
    """Lists the model `x`; answers every completion with a 400 in OpenAI's error shape."""
    body = json.dumps({"error": {"message": REFUSAL, "type": "invalid_request_error"}})
    return StubServer(Script(models=("x",), statuses=[(400, {}, body)] * 10))


async def test_run_on_a_remote_engine_says_the_servers_refusal(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with _refusing() as server:
        code = await run_on_client(RunOptions("say hi", tmp_path, json_out=True),
                                   RemoteClient(RemoteConfig((server.url,))), roles={}, out=out, err=err)
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
    out, err = io.StringIO(), io.StringIO()
    with _refusing() as server:
        await run_on_client(RunOptions("say hi", tmp_path, json_out=True),
                            RemoteClient(RemoteConfig((server.url,), model="y")), roles={}, out=out, err=err)
    assert "warning: --remote-model 'y' is not among the models listed" in err.getvalue()
    assert "lists 'x'" in err.getvalue()
