"""Provides `GcPacer`: the app's full (generation-2) garbage collections, run between keys.

CPython starts a full collection on its own whenever enough objects have outlived two young
collections; each one walks every tracked object the app holds and stops the whole process while
it does. With eight panes streaming, the app ran one every 0.6 s on average, each 130-360 ms on a
busy 2-core machine (a quarter of the UI thread's time), and a key typed meanwhile waited for it.

So while the app runs: the objects that exist once it has started (modules, styles, the first
widgets) are frozen (`gc.freeze`: never walked again), the automatic full collection is switched
off, the young generation is collected less often (a frame makes tens of thousands of short-lived
strips and segments, nearly all freed by reference counting, not by the collector), and `tick` runs the full collection itself: when no
key has come for `idle_s`, at most every `every_s`, and regardless of keys after `max_s` (so
cyclic garbage is still reclaimed within `max_s` however long someone types). `stop` restores
the interpreter's settings.
"""

from __future__ import annotations

import gc
import time

FULL_EVERY_S = 5.0  # the shortest time between two full collections
FULL_MAX_S = 20.0  # the longest: a full collection runs then even while keys come
IDLE_S = 0.3  # "no key for this long": the user is not typing
NEVER = 2**31 - 1  # a generation-2 threshold that young collections never reach
YOUNG, MIDDLE = 10_000, 10  # thresholds of generations 0 and 1 while the pacer runs (CPython: 700, 10)


class GcPacer:
    def __init__(self, *, every_s: float = FULL_EVERY_S, max_s: float = FULL_MAX_S, idle_s: float = IDLE_S,
                 clock=time.monotonic) -> None:
        self.every_s, self.max_s, self.idle_s, self.clock = every_s, max_s, idle_s, clock
        self._saved: tuple[int, int, int] | None = None
        self.last_full = clock()
        self.full_collections = 0

    @property
    def running(self) -> bool:
        return self._saved is not None

    def start(self) -> None:
        if self._saved is not None:
            return
        gc.collect()
        gc.freeze()
        self._saved = gc.get_threshold()
        gc.set_threshold(YOUNG, MIDDLE, NEVER)
        self.last_full = self.clock()

    def tick(self, last_key_at: float) -> bool:
        """Run a full collection if it is due (see the module doc); True if one ran."""
        if self._saved is None:
            return False
        now = self.clock()
        since = now - self.last_full
        if since < self.every_s or (now - last_key_at < self.idle_s and since < self.max_s):
            return False
        gc.collect()
        self.last_full = self.clock()
        self.full_collections += 1
        return True

    def stop(self) -> None:
        if self._saved is None:
            return
        gc.set_threshold(*self._saved)
        gc.unfreeze()
        self._saved = None
