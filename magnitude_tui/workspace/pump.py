"""Provides EventPump, the app's one reader of the engine's event stream, and BatchInbox, how a
subscriber that lives on a screen takes its batches when that screen gets to them."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from magnitude_tui.engine.protocol import EngineClient, EngineEvent

PUMP_WAIT_S = 0.2  # longest blocking wait for the next batch (bounds shutdown latency)
PUMP_SLICE_S = 0.02  # longest the pump holds the event loop while draining a backlog

Batch = list[EngineEvent]
Subscriber = Callable[[Batch], None]


class EventPump:
    """Reads the client's batches (one per engine step) and hands each to every subscriber, in the
    order they subscribed: the serve hub first, so an HTTP reply never waits on a screen."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.subscribers: list[Subscriber] = []
        self.num_batches = 0  # batches handed out (tests wait on counts, never on wall time)

    def subscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)

    async def run(self) -> None:
        """Until cancelled: a blocking wait on a thread, then whatever is already queued without a
        thread hop each, so a fast engine (thousands of steps a second) cannot outrun the app."""
        loop = asyncio.get_running_loop()
        while True:
            batch = await loop.run_in_executor(None, self.client.poll_events, PUMP_WAIT_S)
            deadline = loop.time() + PUMP_SLICE_S
            while batch is not None:
                self.num_batches += 1
                for subscriber in list(self.subscribers):
                    subscriber(batch)
                if loop.time() > deadline:
                    await asyncio.sleep(0)  # the app draws and reads keys between slices of a backlog
                    deadline = loop.time() + PUMP_SLICE_S
                batch = self.client.poll_events(0)


class BatchInbox:
    """A subscriber that keeps batches until its owner takes them: `wake` is called once when the
    first batch arrives after a take (a screen posts itself a message), never once per batch."""

    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake
        self._batches: deque[Batch] = deque()
        self._woken = False

    def __call__(self, batch: Batch) -> None:
        self._batches.append(batch)
        if not self._woken:
            self._woken = True
            self._wake()

    @property
    def num_waiting(self) -> int:
        return len(self._batches)

    def take(self) -> Batch | None:
        """The oldest batch not taken yet, or None (and the next batch wakes the owner again)."""
        if self._batches:
            return self._batches.popleft()
        self._woken = False
        return None
