"""Through the worker: malformed commands never stop it; a killed worker fails every live request fast."""

from __future__ import annotations

import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import CommandRejected, EngineConfig, PolicyChanged, RejectReason, StepReport
from magnitude_tui.engine.protocol import seq_updates
from magnitude_tui.engine.waiting import events_until, wait_ready
from magnitude_tui.reliability.crash import ENDLESS, kill_worker
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams


def _events(client, until):
    return events_until(client, until, 30.0)


_updates = seq_updates


def _done(events, rid):
    return [u for u in _updates(events) if u.request_id == rid and u.phase is Phase.DONE]


def test_malformed_requests_and_commands_never_stop_the_worker():
    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=4096)), in_process=True)
    client.start()
    try:
        wait_ready(client, 30.0)
        client.submit(Request("bad", "b", (Message("user", None),)))  # once killed the engine
        client.submit(Request("bad2", "b2", ({"role": "user", "content": "x"},)))
        client.set_policy(None)
        client._send(object())  # a command the worker does not know
        client.cancel(None)
        client.submit(Request("good", "g", (Message("user", "hi"),), SamplingParams(max_tokens=5)))
        evs = _events(client, lambda evs: _done(evs, "good") and len(
            [e for e in evs if isinstance(e, CommandRejected)]) >= 3)
        rejected = [e.message for e in evs if isinstance(e, CommandRejected)]
        assert any("policy not changed" in m for m in rejected)
        assert any("unknown command object" in m for m in rejected)
        assert any("Cancel ignored" in m for m in rejected)
        assert "content" in _done(evs, "bad")[0].error and "not a Message" in _done(evs, "bad2")[0].error
        assert _done(evs, "good")[0].done_reason is DoneReason.LENGTH
        assert client.alive and not client._live
        client.set_policy("fixed:16")
        evs = _events(client, lambda evs: any(isinstance(e, PolicyChanged) for e in evs))
        assert [e.policy for e in evs if isinstance(e, PolicyChanged)] == ["fixed:16"]
    finally:
        client.stop()


@pytest.mark.serial
@pytest.mark.parametrize("reuse_id", [False, True])
def test_kill_9_fails_every_live_request_within_a_second_and_restart_works(reuse_id):
    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=1 << 20, n_seq_max=4)), log_path=None)
    client.start()
    try:
        wait_ready(client, 30.0)
        for i in range(3):
            client.submit(Request(f"r{i}", f"s{i}", (Message("user", "talk"),), ENDLESS))
        _events(client, lambda evs: {u.request_id for u in _updates(evs) if u.phase is Phase.GENERATING}
                >= {"r0", "r1", "r2"})
        if reuse_id:
            # The same id again, for another conversation: rejected apart from the original.
            client.submit(Request("r0", "intruder", (Message("user", "me too"),), ENDLESS))
            evs = _events(client, lambda evs: any(r for e in evs if isinstance(e, StepReport) for r in e.rejected))
            [rej] = [r for e in evs if isinstance(e, StepReport) for r in e.rejected]
            assert rej.reason is RejectReason.DUPLICATE_ID and rej.session_id == "intruder"
            assert not _done(evs, "r0")  # the original was not ended by its impostor
        killed = kill_worker(client, {"r0", "r1", "r2"})
        errors = killed.ended
        assert set(errors) == {"r0", "r1", "r2"} and killed.failed is not None
        assert killed.seconds < 1.0, killed.seconds
        for u in errors.values():
            assert u.done_reason is DoneReason.ERROR and "SIGKILL" in u.error
        assert errors["r0"].session_id == "s0"  # the original's conversation, not the impostor's
        client.restart()
        wait_ready(client, 30.0)
        client.submit(Request("r0", "s0", (Message("user", "again"),), SamplingParams(max_tokens=4)))
        evs = _events(client, lambda evs: _done(evs, "r0"))
        assert _done(evs, "r0")[0].done_reason is DoneReason.LENGTH
    finally:
        client.stop()
