"""--remote-model naming a model a server's /v1/models does not list is said at start-up: as a
warning (the app shows it, generate prints it), not a failure, since a server that serves one
model whatever a request calls it (llama-server) answers, and one that checks the name refuses
each request with a 404 that names its models. Nothing said so before: a typo in the name went
unnoticed, or surfaced only as 404s on every pane."""

from __future__ import annotations

from magnitude_tui.engine.events import CommandRejected, EngineReady
from scheduler.types import DoneReason
from tests.app_support import SIZE, make_app, wait_for
from tests.openai_stub import Script, StubServer
from tests.test_remote_client import chat, run_client  # noqa: F401 (the fixture)


def warnings(run) -> list[str]:
    return [e.message for e in run.events if isinstance(e, CommandRejected)]


def test_a_model_the_server_does_not_list_is_said_and_requests_still_run(run_client):  # noqa: F811
    with StubServer(Script(words=2, models=("SmolLM2-135M-Instruct.Q4_1.gguf",))) as stub:
        run = run_client([stub.url], model="smollm")
        assert run.ready().model == "smollm"
        run.until(lambda: warnings(run))
        (said,) = warnings(run)
        assert "--remote-model 'smollm' is not among the models listed" in said
        assert f"{stub.url} lists 'SmolLM2-135M-Instruct.Q4_1.gguf'" in said
        # The warning follows EngineReady in a later batch: a caller that stops reading at ready sees it.
        ready_at = next(i for i, e in enumerate(run.events) if isinstance(e, EngineReady))
        assert next(i for i, e in enumerate(run.events) if isinstance(e, CommandRejected)) > ready_at
        run.client.submit(chat("a"))
        final = run.final("a")
        assert final.error is None and final.done_reason is DoneReason.STOP
        assert stub.requests[-1]["body"]["model"] == "smollm"  # the name is sent as given


def test_a_listed_model_or_none_named_says_nothing(run_client):  # noqa: F811
    with StubServer(Script(words=2, models=("a-model", "b-model"))) as one, StubServer(Script(words=2)) as two:
        named = run_client([one.url], model="b-model")
        unnamed = run_client([one.url, two.url])
        for run in (named, unnamed):
            run.ready()
            run.client.submit(chat("a"))
            assert run.final("a").error is None
            assert not warnings(run)


def test_each_server_that_does_not_list_it_is_named(run_client):  # noqa: F811
    with StubServer(Script(models=("m",))) as has, StubServer(Script(models=("x", "y"))) as lacks:
        run = run_client([has.url, lacks.url], model="m")
        run.ready()
        run.until(lambda: warnings(run))
        (said,) = warnings(run)
        assert f"{lacks.url} lists 'x', 'y'" in said and has.url not in said


def test_generate_prints_the_warning(capsys):
    from magnitude_tui.generate import run_generate
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig

    # A listed name in brackets (a quantisation tag) was read as markup: gone, or a MarkupError.
    with StubServer(Script(words=2, models=("other[q4]", "[/x]"))) as stub:
        code = run_generate(["one"], RemoteClient(RemoteConfig((stub.url,), model="mine")), max_tokens=2,
                            temperature=0.0, seed=None, stream=False)
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0 and "--remote-model 'mine' is not among the models listed" in out
    assert "'other[q4]', '[/x]'" in out


async def test_the_app_shows_the_warning(tmp_path):
    from magnitude_tui.remote.client import RemoteClient
    from magnitude_tui.remote.config import RemoteConfig

    with StubServer(Script(models=("other",))) as stub:
        app = make_app(tmp_path, RemoteClient(RemoteConfig((stub.url,), model="mine")))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: any("'mine' is not among the models listed" in n.message
                                              for n in app._notifications), what="the warning")
            assert app.workspace.engine_ready
