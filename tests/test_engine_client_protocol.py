"""One conformance test, run against every EngineClient: the local worker client (in process,
fake backend), the tests' scripted client, the paced stand-in of `bench ui-cpu` and the remote
client (against a scripted OpenAI-compatible server)."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack

import pytest

from backend.factory import BackendConfig
from magnitude_bench.ui_cpu import PacedClient
from magnitude_tui.engine import worker
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import (
    CommandRejected,
    EngineConfig,
    EngineReady,
    LoadProgress,
    PolicyChanged,
    RestoreOutcome,
    SeqUpdate,
    SessionRestored,
    SpecChanged,
)
from magnitude_tui.engine.protocol import EngineClient, seq_updates
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.app_support import ScriptedClient
from tests.openai_stub import Script, StubServer

KINDS = ["worker", "scripted", "remote"]


class Harness:
    """A client plus what a test needs to drive it: `pump` advances a client that only moves when
    told (the scripted one), `release` lets a held load finish."""

    def __init__(self, client: EngineClient, pump=lambda: None, release=lambda: None) -> None:
        self.client, self.pump, self.release = client, pump, release
        self.seen: list[object] = []

    def events(self, until, timeout: float = 20.0) -> list[object]:
        deadline = time.monotonic() + timeout
        got: list[object] = []
        while time.monotonic() < deadline:
            self.pump()
            batch = self.client.poll_events(0.05)
            if batch:
                got.extend(batch)
                self.seen.extend(batch)
                if until(got):
                    return got
        raise AssertionError(f"timed out; saw {[type(e).__name__ for e in got]}")

    def answer(self, *kinds: type) -> object:
        """The first event of one of `kinds` to arrive from now: a command's answer."""
        got = self.events(lambda evs: any(isinstance(e, kinds) for e in evs))
        return next(e for e in got if isinstance(e, kinds))

    def updates_of(self, rid: str) -> list[SeqUpdate]:
        """Every update of `rid`, once its done update has come."""
        done = lambda evs: any(u.request_id == rid and u.phase is Phase.DONE for u in _updates(evs))  # noqa: E731
        if not done(self.seen):
            self.events(done)
        return [u for u in _updates(self.seen) if u.request_id == rid]


_updates = seq_updates


@pytest.fixture(params=KINDS)
def harness(request, monkeypatch):
    with ExitStack() as stack:
        gate = threading.Event()
        if request.param == "worker":
            real = worker.build_backend

            def held(config, on_progress=None):
                gate.wait(20)  # the "model" loads when the test says so
                return real(config, on_progress)

            monkeypatch.setattr(worker, "build_backend", held)
            client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=8192), policy="fixed:16"),
                                  in_process=True)
            h = Harness(client, release=gate.set)
        elif request.param == "scripted":
            client = ScriptedClient(auto_ready=False)
            h = Harness(client, pump=lambda: client.step() if client.live and client.loaded else None,
                        release=client.ready)
        else:
            stub = stack.enter_context(StubServer(Script(words=400, delay_s=0.01)))
            stub.script.models_delay_s = 0.3  # connecting takes a moment: early requests are `loading`
            client = RemoteClient(RemoteConfig((stub.url,)))
            h = Harness(client, release=lambda: None)
        stack.callback(client.stop)
        yield h


def chat(rid: str, session: str, text: str = "hello there", max_tokens: int = 8) -> Request:
    return Request(rid, session, (Message("user", text),), SamplingParams(max_tokens=max_tokens))


def test_every_client_satisfies_the_engine_client_protocol(harness):
    client = harness.client
    assert isinstance(client, EngineClient)
    assert isinstance(PacedClient(), EngineClient)
    assert client.target.where

    # A request sent while the engine loads is reported `loading`, then runs once it is ready.
    client.start()
    client.submit(chat("early", "s-early"))
    harness.events(lambda evs: any(u.request_id == "early" for u in _updates(evs)))
    harness.release()
    harness.events(lambda evs: any(isinstance(e, EngineReady) for e in evs))
    assert any(isinstance(e, LoadProgress) for e in harness.seen)
    early = harness.updates_of("early")
    assert early[0].phase is Phase.LOADING
    assert [u.phase for u in early].count(Phase.DONE) == 1
    assert early[-1].done_reason in (DoneReason.STOP, DoneReason.LENGTH) and early[-1].error is None
    assert "".join(u.text_delta for u in early).strip()

    # A normal turn streams text and ends once.
    client.submit(chat("r1", "s1"))
    r1 = harness.updates_of("r1")
    assert r1[-1].phase is Phase.DONE and r1[-1].generated > 0
    assert sum(u.phase is Phase.DONE for u in r1) == 1
    assert r1[-1].ttft_ms is not None and r1[-1].queue_ms is not None

    # A cancel ends a long request as cancelled, once.
    client.submit(chat("long", "s2", max_tokens=10_000))
    harness.events(lambda evs: any(u.request_id == "long" and u.phase is Phase.GENERATING for u in _updates(evs)))
    client.cancel("long")
    long = harness.updates_of("long")
    assert long[-1].done_reason is DoneReason.CANCELLED
    assert sum(u.phase is Phase.DONE for u in long) == 1

    # Closing a conversation ends its live request.
    client.submit(chat("closed", "s3", max_tokens=10_000))
    harness.events(lambda evs: any(u.request_id == "closed" and u.phase is Phase.GENERATING
                                   for u in _updates(evs)))
    client.close_session("s3")
    assert harness.updates_of("closed")[-1].done_reason is DoneReason.CANCELLED

    # Policies: an invalid one is rejected (target:0 too); a valid one is either taken or, by an
    # engine that does not schedule itself (remote), rejected with the reason.
    client.set_policy("target:0")
    assert isinstance(harness.answer(CommandRejected, PolicyChanged), CommandRejected)
    client.set_policy("fixed:32")
    answer = harness.answer(CommandRejected, PolicyChanged)
    assert isinstance(answer, CommandRejected) or answer.policy == "fixed:32"

    # Speculation: an unknown mode, or `draft` with no draft model, is rejected; `ngram` is taken
    # by a local engine and rejected, with the reason, by a remote one.
    client.set_spec("draft")
    assert isinstance(harness.answer(CommandRejected, SpecChanged), CommandRejected)
    client.set_spec("ngram")
    answer = harness.answer(CommandRejected, SpecChanged)
    assert isinstance(answer, CommandRejected) or answer.spec == "ngram"

    # Warm resume: every engine answers, even one that keeps no saved KV (then it says why).
    client.restore_session("s1", (Message("user", "hello there"),))
    restored = harness.answer(SessionRestored)
    assert restored.session_id == "s1" and restored.outcome is not RestoreOutcome.RESTORED
    assert restored.detail

    assert client.alive
    client.stop()
    assert not client.alive


def test_every_client_restarts_and_serves_again(harness):
    client = harness.client
    client.start()
    harness.release()
    harness.events(lambda evs: any(isinstance(e, EngineReady) for e in evs))
    client.submit(chat("before", "s1"))
    assert harness.updates_of("before")[-1].error is None

    # After restart() (ctrl+r: after a death, or to reconnect) the stream goes on: the engine
    # loads or connects again and takes new work.
    client.restart()
    harness.release()
    harness.events(lambda evs: any(isinstance(e, EngineReady) for e in evs))
    assert client.alive
    client.submit(chat("after", "s2"))
    after = harness.updates_of("after")
    assert sum(u.phase is Phase.DONE for u in after) == 1
    assert after[-1].done_reason in (DoneReason.STOP, DoneReason.LENGTH) and after[-1].error is None
    assert "".join(u.text_delta for u in after).strip()


def test_policy_and_speculation_mode_cross_the_worker_pipe_typed():
    """The client parses a policy or mode once, where it was typed; the command carries the parsed
    value, which pickles as the pipe to a worker process needs."""
    import pickle

    from magnitude_tui.engine.events import SetPolicy, SetSpec
    from scheduler.budget import parse_policy
    from scheduler.speculation import SpecMode

    for command in (SetPolicy(parse_policy("fixed:16")), SetSpec(SpecMode.NGRAM)):
        assert pickle.loads(pickle.dumps(command)) == command
