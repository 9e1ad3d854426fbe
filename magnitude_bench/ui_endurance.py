"""Provides the UI endurance run (scenario 15): one pane receives a flood of tokens while the
others stream and the terminal is resized again and again; the app's memory and its key-to-screen
latency are measured throughout.

The app runs headless on `FloodClient`, `bench ui-cpu`'s paced stand-in engine with the first pane's
request given many tokens a step. The flood follows the clock, not the step count (the stand-in's
thread shares the app's interpreter lock and falls behind on a busy machine), so the run takes the
same time however slow the steps. Keys are timed as `bench ui` times them, with resizes between keys.
Memory (resident set) is read at the flood's start, halfway and end: a reply 100,000 tokens longer
holds its text, but what the app keeps beside it must not grow with it.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from magnitude_bench.ui_cpu import PacedClient
from magnitude_bench.ui_keys import FrameProbe, KeyFigures, open_panes, run_on_stand_in, type_and_time_key, wait_until


def rss_mb() -> float:
    """This process's resident memory in MiB (Linux; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


class FloodClient(PacedClient):
    """PacedClient whose first request gets `burst` tokens per step (more when steps come late: what
    `burst` a step at `step_hz` owes since its first token) until it has `flood` tokens."""

    def __init__(self, *, flood: int, burst: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.flood, self.burst = flood, burst
        self.flood_id: str | None = None
        self.flood_sent = 0
        self._flood_t0: float | None = None  # step time of the flood's first tokens

    def submit(self, request) -> None:
        super().submit(request)
        if self.flood_id is None:
            self.flood_id = request.request_id

    def _step(self, t: float):
        from scheduler.types import DoneReason, Phase

        report = super()._step(t)
        for u in report.updates:
            if u.request_id != self.flood_id or u.phase is not Phase.GENERATING:
                continue
            if self._flood_t0 is None:
                self._flood_t0 = t
            owed = round((t - self._flood_t0) * self.step_hz * self.burst) + self.burst - self.flood_sent
            n = min(max(self.burst, owed), self.flood - self.flood_sent)  # never past the flood
            words = [self.words[(self.flood_sent + i) % len(self.words)] for i in range(n)]
            self.flood_sent += n
            u.text_delta += "".join(words)
            u.new_tokens += n
            u.generated = self.flood_sent
            if self.flood_sent >= self.flood:
                u.phase, u.done_reason = Phase.DONE, DoneReason.LENGTH
                with self._lock:
                    self._live.pop(u.request_id, None)
        return report


@dataclass
class EnduranceConfig:
    panes: int = 8
    flood: int = 100_000  # tokens into the first pane
    burst: int = 40  # of them per step
    step_hz: float = 25.0
    resizes: int = 50
    sizes: tuple = ((160, 50), (120, 40), (200, 60), (100, 34))
    key_interval_s: float = 0.1
    settle_timeout_s: float = 120.0  # for the flooded pane's reply to end and be drawn
    stream: bool = True  # False: no prompts; `resizes` resizes, a key after each (the floor)
    history: int = 0  # finished turns (a question, the stand-in's reply) in each pane first


@dataclass
class EnduranceResult:
    config: dict
    wall_s: float
    tokens: int
    resizes: int
    rss_start_mb: float
    rss_mid_mb: float
    rss_end_mb: float
    reply_chars: int
    keys: list = field(default_factory=list)  # latency ms per key (None: not painted within 2 s)
    settle_s: float = 0.0  # from the flood's last token to its reply drawn as one document
    # Per resize: ms from handing the new size to the app to the first frame laid out at it (None:
    # none within the run), and which keys were the ones typed right after a resize.
    resize_frames_ms: list = field(default_factory=list)
    after_resize: list = field(default_factory=list)  # per key: typed right after a resize
    widgets: int = 0  # on the screen when the flood ended

    @property
    def keys_missed(self) -> int:
        return sum(1 for k in self.keys if k is None)

    def keys_where(self, after_resize: bool | None = None) -> KeyFigures:
        """The figures of the keys typed right after a resize, of all the others, or (None) of every key."""
        return KeyFigures.of([k for k, a in zip(self.keys, self.after_resize) if after_resize is None or a == after_resize])

    def resize_frames(self) -> tuple[float | None, float | None]:
        """p50 and max of the resizes' frames (None: no resize drew one)."""
        frames = [ms for ms in self.resize_frames_ms if ms is not None]
        return (statistics.median(frames), max(frames)) if frames else (None, None)

    def summary(self) -> str:
        f = lambda v: "—" if v is None else f"{v:.0f}"  # noqa: E731
        every, away, after = self.keys_where(), self.keys_where(False), self.keys_where(True)
        frame_p50, frame_max = self.resize_frames()
        what = (f"{self.tokens:,} tokens into one pane ({self.reply_chars:,} chars) beside "
                f"{self.config['panes'] - 1} streaming" if self.config.get("stream", True)
                else f"{self.config['panes']} empty panes")
        if self.config.get("history"):
            what += f", {self.config['history']} turns of history each, {self.widgets} widgets"
        return (f"{what}, {self.resizes} resizes in {self.wall_s:.0f} s: "
                f"RSS {self.rss_start_mb:.0f} -> {self.rss_mid_mb:.0f} -> {self.rss_end_mb:.0f} MiB; "
                f"keypress p50 {f(every.p50_ms)} p95 {f(every.p95_ms)} max {f(every.max_ms)} ms "
                f"({len(self.keys)} keys, {self.keys_missed} missed; typed right after a resize: p50 "
                f"{f(after.p50_ms)} max {f(after.max_ms)}, the others: p95 {f(away.p95_ms)}); a resize's "
                f"frame p50 {f(frame_p50)} max {f(frame_max)} ms; settled {self.settle_s:.1f} s after")


async def _add_history(panes, turns: int) -> None:
    """Give each pane `turns` finished turns: a question and the stand-in engine's reply (Markdown
    with a list, as a model's answer often is), as a resumed long session has them."""
    from magnitude_bench.ui_cpu import REPLY
    from magnitude_tui.store import MessageRecord

    for pane in panes:
        for i in range(turns):
            await pane.add_message(MessageRecord("user", f"question {i + 1}: and then?"))
            await pane.add_message(MessageRecord("assistant", REPLY))


def _frame_after(layout_frames: list[float], t: float) -> float | None:
    """Milliseconds from `t` to the first frame laid out after it (None: none)."""
    i = bisect.bisect_right(layout_frames, t)
    return (layout_frames[i] - t) * 1e3 if i < len(layout_frames) else None


async def run_endurance(cfg: EnduranceConfig = EnduranceConfig()) -> EnduranceResult:
    """The flood (or, with `cfg.stream` False, the same resizes and keys on empty panes: what a
    resize costs the app with nothing in its panes, the floor under the flooded run's figures)."""
    from textual import events
    from textual.geometry import Size

    from magnitude_bench.ui import prompts
    from magnitude_tui.widgets.chat_pane import ChatPane
    from magnitude_tui.widgets.composer import Composer

    client = FloodClient(flood=cfg.flood, burst=cfg.burst, step_hz=cfg.step_hz, tokens=10**9)

    async def measure(app, pilot, probe: FrameProbe) -> EnduranceResult:
        panes = await open_panes(app, pilot, cfg.panes)
        await _add_history(panes, cfg.history)
        if cfg.stream:
            for pane, text in zip(panes, prompts(len(panes))):
                pane.post_message(ChatPane.Submitted(pane, text))
        composer = panes[1].query_one(Composer)  # typed into a pane beside the flood
        composer.focus()
        resized_at: list[float] = []

        def resize(size: tuple[int, int]) -> None:  # what the terminal driver does on SIGWINCH
            resized_at.append(time.perf_counter())
            assert app._driver is not None  # the app runs
            app._driver._size = Size(*size)
            app.post_message(events.Resize(Size(*size), Size(*size)))

        rss_start, rss_mid = rss_mb(), None
        keys: list[float | None] = []
        after: list[bool] = []
        t0, i = time.perf_counter(), 0
        resize_every = max(1.0, cfg.flood / cfg.burst / cfg.step_hz / cfg.resizes)
        next_resize = t0 + resize_every
        while client.flood_sent < cfg.flood if cfg.stream else len(resized_at) < cfg.resizes:
            now = time.perf_counter()
            just_resized = len(resized_at) < cfg.resizes and (now >= next_resize or not cfg.stream)
            if just_resized:
                resize(cfg.sizes[(len(resized_at) + 1) % len(cfg.sizes)])
                next_resize = now + resize_every
                await asyncio.sleep(0.05)
            if rss_mid is None and client.flood_sent >= cfg.flood // 2:
                rss_mid = rss_mb()
            keys.append(await type_and_time_key(probe, composer, i))
            after.append(just_resized)
            i += 1
            await asyncio.sleep(cfg.key_interval_s if cfg.stream else 0.3)
        while len(resized_at) < cfg.resizes:  # the rest, if the flood outran them
            resize(cfg.sizes[(len(resized_at) + 1) % len(cfg.sizes)])
            await asyncio.sleep(0.05)
        wall = time.perf_counter() - t0
        widgets = sum(1 for _ in app.screen.walk_children())
        t_end = time.perf_counter()
        flooded = panes[0]
        await wait_until(lambda: not (flooded.busy or flooded.has_ended), cfg.settle_timeout_s,
                         "the flooded pane's reply did not settle")
        settle_s = time.perf_counter() - t_end
        rss_end = rss_mb()
        messages = flooded.record.messages
        return EnduranceResult(
            config=asdict(cfg), wall_s=wall, tokens=client.flood_sent, resizes=len(resized_at),
            rss_start_mb=rss_start, rss_mid_mb=rss_mid or rss_end, rss_end_mb=rss_end,
            reply_chars=len(messages[-1].content) if messages else 0, keys=keys,
            settle_s=settle_s, after_resize=after, widgets=widgets,
            resize_frames_ms=[_frame_after(probe.layout_frames, t) for t in resized_at])

    return await run_on_stand_in(client, "endurance.db", cfg.sizes[0], measure)
