"""Blocking waits on an engine's event stream: until a condition, until ready, and what a timeout
or a failed start says."""

from __future__ import annotations

import queue

import pytest

from magnitude_tui.engine.events import EngineFailed, EngineReady, LoadProgress, PolicyChanged
from magnitude_tui.engine.waiting import EngineStartFailed, NoEventInTime, events_until, wait_ready


class Batches:
    """poll_events over batches queued by the test (the rest of EngineClient is not needed)."""

    def __init__(self, *batches: list) -> None:
        self._queue: queue.Queue = queue.Queue()
        for batch in batches:
            self._queue.put(batch)

    def poll_events(self, timeout=0.0):
        try:
            return self._queue.get(timeout=timeout) if timeout else self._queue.get_nowait()
        except queue.Empty:
            return None


READY = EngineReady(model="m.gguf", device="CPU", n_ctx=4096, n_seq_max=4, n_batch=512, policy="fixed:16")
HALF, ALL = LoadProgress(0.5, "m.gguf", "CPU"), LoadProgress(1.0, "m.gguf", "CPU")


def test_events_until_returns_every_event_up_to_the_batch_where_the_condition_holds():
    client = Batches([PolicyChanged("a")], [PolicyChanged("b"), PolicyChanged("c")], [PolicyChanged("d")])
    got = events_until(client, lambda evs: any(e.policy == "b" for e in evs), 5.0)
    assert [e.policy for e in got] == ["a", "b", "c"]
    assert client.poll_events() == [PolicyChanged("d")]  # the next batch is left for the caller


def test_a_timeout_names_what_was_awaited_and_keeps_what_came():
    client = Batches([PolicyChanged("a")])
    with pytest.raises(NoEventInTime, match=r"the answer did not come within 0.3 s \(last events: PolicyChanged\)") as e:
        events_until(client, lambda evs: False, 0.3, what="the answer", poll_s=0.05)
    assert e.value.seen == [PolicyChanged("a")]


def test_wait_ready_returns_the_ready_event_and_hands_over_what_came_before():
    client = Batches([HALF], [ALL, READY])
    seen: list = []
    assert wait_ready(client, 5.0, seen=seen) is READY
    assert seen == [HALF, ALL, READY]


def test_wait_ready_raises_the_engines_reason_when_it_fails_to_start():
    client = Batches([HALF], [EngineFailed("model file not found: /nope.gguf")])
    with pytest.raises(EngineStartFailed, match="model file not found: /nope.gguf"):
        wait_ready(client, 5.0)
    with pytest.raises(NoEventInTime, match="EngineReady did not come"):
        wait_ready(Batches(), 0.2, poll_s=0.05)
