"""Provides what the UI benchmarks share (`bench ui`, `bench ui-cpu`, the UI endurance run): the app
opened with N panes once its engine is ready; the key probe, which hands a key to the app as its terminal
driver does and times it to the first frame whose composer row shows it (headless Textual writes
nothing, so `FrameProbe` renders every frame to terminal bytes as a real driver would and reads the row
from it); and, for the runs on a stand-in engine, the app's headless run around their measurement.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

R = TypeVar("R")
DIGITS = "1234567"  # typed keys: never in the composer's placeholder, so a match is the typed text


def _row_text(update, y: int, x0: int, x1: int) -> str | None:
    """The text of screen row y between x0 and x1 in a compositor update, or None if it has no row y."""
    from textual._compositor import ChopsUpdate, LayoutUpdate

    if isinstance(update, ChopsUpdate):
        if not any(sy == y for sy, _, _ in update.spans):
            return None
        return "".join(s.text for x, s in sorted(update.chops[y].items()) if s is not None and x < x1 and x + s.cell_length > x0)
    if isinstance(update, LayoutUpdate) and update.region.y <= y < update.region.bottom:
        return "".join(s.text for s in update.strips[y - update.region.y])
    return None


class FrameProbe:
    """Hooks the app's display: counts the frames a terminal driver would be given, and notes the
    moment (`pending["t1"]`) a frame first shows `pending["want"]` in the row `pending["row"]`:
    (y, x0, x1), or a function giving it for each frame (where a widget is in that frame: a
    resize laid out after the key was sent moves the composer)."""

    def __init__(self, app) -> None:
        self.app, self.frames, self.seen = app, 0, asyncio.Event()
        self.pending: dict[str, Any] = {}
        self.layout_frames: list[float] = []  # when each frame that laid the screen out was drawn
        self._display = app._display
        app._display = self._painted

    def expect(self, want: str, row: tuple[int, int, int] | Callable[[], tuple[int, int, int]], **extra) -> None:
        """About to send a key: wait for `want` in `row` (y, x0, x1) from now on."""
        self.seen.clear()
        self.pending.clear()
        self.pending.update(want=want, row=row, **extra)
        self.pending["t0"] = time.perf_counter()

    def latency_ms(self) -> float | None:
        p = self.pending
        return (p["t1"] - p["t0"]) * 1e3 if "t1" in p else None

    def _painted(self, screen, update) -> None:
        if update is not None:
            from textual._compositor import LayoutUpdate

            update.render_segments(self.app.console)  # the bytes a real terminal driver would write
            self.frames += 1
            if isinstance(update, LayoutUpdate):
                self.layout_frames.append(time.perf_counter())
            p = self.pending
            if p and "t1" not in p:
                row = p["row"]() if callable(p["row"]) else p["row"]
                text = _row_text(update, *row)
                if text is not None and p["want"] in text:
                    p["t1"] = time.perf_counter()
                    self.seen.set()
        self._display(screen, update)


def send_key(app, key: str, char: str | None) -> None:
    """Hand a key event to the app as its terminal driver does with a key it read (not
    pilot.press: that waits for an idle app, and streaming panes never idle)."""
    from textual import events

    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)


async def type_and_time_key(probe: FrameProbe, composer, i: int, *, timeout_s: float = 2.0,
                            **extra) -> float | None:
    """Type the i-th key of the probe sequence into `composer` and return the milliseconds until a
    frame showed it (None: not within `timeout_s`). Every len(DIGITS) keys the composer is emptied
    first, so the typed text stays on its row. `extra` is kept in `probe.pending`."""
    ch = DIGITS[i % len(DIGITS)]
    if i % len(DIGITS) == 0:
        composer.value = ""
        await asyncio.sleep(0.05)
    def row() -> tuple[int, int, int]:  # the composer's row in the frame being drawn
        r = composer.region
        return r.y, r.x, r.right

    probe.expect(composer.value + ch, row, **extra)
    send_key(probe.app, ch, ch)
    with suppress(asyncio.TimeoutError):
        await asyncio.wait_for(probe.seen.wait(), timeout_s)
    return probe.latency_ms()


@dataclass
class KeyFigures:
    """p50 / p95 / max of the keys, and how many were not painted at all (None: no key).

    A key not painted within its timeout counts in the percentiles as taking that long (it took at
    least that): left out, a run whose slowest keys never showed would read faster than one whose
    slowest keys did."""

    p50_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    missed: int

    @classmethod
    def of(cls, keys: list[float | None], timeout_ms: float = 2000.0) -> "KeyFigures":
        from scheduler.stats import percentile

        timed = [timeout_ms if k is None else k for k in keys]
        return cls(statistics.median(timed) if timed else None, percentile(timed, 95),
                   max(timed) if timed else None, sum(k is None for k in keys))

    @classmethod
    def fields_of(cls, keys: list[float | None]) -> dict:
        """A UI run result's `keys` with their `key_p50_ms`, `key_p95_ms` and `key_max_ms`."""
        f = cls.of(keys)
        return {"keys": keys, "key_p50_ms": f.p50_ms, "key_p95_ms": f.p95_ms, "key_max_ms": f.max_ms}


async def wait_until(done: Callable[[], bool], timeout_s: float, failure: str,
                     pause: Callable[[float], Any] = asyncio.sleep, poll_s: float = 0.05) -> None:
    """Check `done` every `poll_s` seconds (`pause`: asyncio.sleep, or a pilot's pause) until it
    holds; RuntimeError(failure) once `timeout_s` ran out first."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        await pause(poll_s)


async def open_panes(app, pilot, panes: int, *, timeout_s: float = 30.0, poll_s: float = 0.02) -> list:
    """Wait for the app's engine to report ready, then open panes (ctrl+n) until there are
    `panes`; returns them. An engine that is not ready within `timeout_s` fails the run."""
    ws = app.workspace
    await wait_until(lambda: ws.engine_ready, timeout_s,
                     f"the app's engine did not report ready within {timeout_s:g} s", pilot.pause, poll_s)
    for _ in range(panes - len(ws.grid.panes)):
        await pilot.press("ctrl+n")
    return list(ws.grid.panes)


async def run_on_stand_in(client, db: str, size: tuple[int, int],
                          measure: Callable[[Any, Any, FrameProbe], Awaitable[R]]) -> R:
    """`measure(app, pilot, probe)` on the real app run headless on `client`, a stand-in engine, which
    stops before the app is torn down. That teardown can be cancelled while replies still stream into
    panes being removed (seen 2 in ~10 runs): the figures were taken before, so they are kept."""
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        app = MagnitudeApp(client=client, store=Store(Path(tmp) / db), theme="magnitude", export_dir=Path(tmp))
        probe = FrameProbe(app)
        result: R | None = None
        try:
            async with app.run_test(size=size) as pilot:
                result = await measure(app, pilot, probe)
                client.stop()
        except asyncio.CancelledError:
            if result is None:
                raise
        finally:
            client.stop()
        return result
