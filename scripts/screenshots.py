"""Drive the real app headless and write SVG screenshots into screenshots/.

    python scripts/screenshots.py                 # the real model (llama.cpp, CPU by default)
    python scripts/screenshots.py --backend fake  # no model: quick check of the script itself

Shots: the loading view, several panes streaming, the sequences panel during a burst spawn, and
the light theme. Each is taken when the state it shows is actually on screen (not after a sleep).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.factory import BackendConfig  # noqa: E402
from magnitude_tui.app import MagnitudeApp  # noqa: E402
from magnitude_tui.engine.client import WorkerClient  # noqa: E402
from magnitude_tui.engine.events import EngineConfig  # noqa: E402
from magnitude_tui.store import Store  # noqa: E402
from magnitude_tui.widgets.chat_pane import ChatPane  # noqa: E402
from scheduler.types import Phase, SamplingParams  # noqa: E402

SIZE = (140, 44)
PROMPTS = (
    "Explain in detail how a CPU cache works.",
    "Write a long story about a robot who learns to paint.",
    "Give a detailed list of tips for writing fast Python code, with examples.",
    "Describe the history of the printing press in detail.",
)


async def until(pilot, condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            state = [(p.record.name, p.busy, p.replies.last_update and p.replies.last_update.phase.value)
                     for p in pilot.app.workspace.grid.panes]
            raise TimeoutError(f"gave up waiting for {what}; panes: {state}")
        await pilot.pause(0.05)


def save(app: MagnitudeApp, out: Path, name: str) -> None:
    path = out / f"{name}.svg"
    path.write_text(app.export_screenshot(title=f"magnitude-tui — {name.replace('-', ' ')}"), encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def phases(app: MagnitudeApp) -> list[Phase]:
    return [p.replies.last_update.phase for p in app.workspace.grid.panes
            if p.replies.last_update is not None and p.busy]


async def shoot(config: EngineConfig, out: Path, max_tokens: int, timeout: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        app = MagnitudeApp(client=WorkerClient(config), store=Store(Path(tmp) / "shots.db"),
                           theme="magnitude", sampling=SamplingParams(max_tokens=max_tokens),
                           export_dir=Path(tmp))
        async with app.run_test(size=SIZE) as pilot:
            ws = app.workspace
            # 1. Loading: shoot once the worker reports progress (or after 2 s if loading is instant).
            started = time.monotonic()
            await until(pilot, lambda: ws.engine_ready or ws.loading_view.query_one("ProgressBar").progress
                        or time.monotonic() - started > 2, timeout, "load progress")
            if not ws.engine_ready:
                save(app, out, "loading")
            await until(pilot, lambda: ws.engine_ready, timeout, "the engine")

            # 2. Four panes streaming at once (opened first, then sent in quick succession). Each
            # prompt is posted the way Enter in the composer posts it: pilot.press waits for the app
            # to go idle (up to 2 s a key), and a short reply can end before the last one is sent.
            await pilot.press("ctrl+n", "ctrl+n", "ctrl+n", "tab")
            await pilot.pause(0.3)
            for pane, prompt in zip(ws.grid.panes, PROMPTS):
                pane.post_message(ChatPane.Submitted(pane, prompt))
            await until(pilot, lambda: len(phases(app)) >= 3 and phases(app).count(Phase.GENERATING) >= 2,
                        timeout, "3 panes busy, 2 generating")
            await pilot.pause(0.3)
            save(app, out, "panes-streaming")
            await until(pilot, lambda: not any(p.busy for p in ws.grid.panes), timeout, "replies")

            # 3. Burst spawn from A1 with the sequences panel open.
            ws.grid.focus_pane(ws.grid.panes[1])
            await pilot.press("ctrl+x", "ctrl+x", "ctrl+x")  # close A2-A4; A1 stays
            await pilot.press("f2", "ctrl+b")
            await until(pilot, lambda: len(ws.sequences_panel.live_sessions) >= 6
                        and phases(app).count(Phase.GENERATING) >= 3, timeout, "the burst running")
            await pilot.pause(0.5)
            save(app, out, "burst-sequences")
            await until(pilot, lambda: not any(p.busy for p in ws.grid.panes), timeout, "the burst")

            # 4. The light theme, A1 zoomed with the subagents' answers posted back.
            app.theme = "magnitude-paper"
            ws.grid.focus_pane(ws.grid.panes[0])
            await pilot.press("ctrl+o", "f2")
            await pilot.pause(0.8)
            save(app, out, "light-theme-zoomed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="llama", help="llama | fake | simulated:<profile>")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--max-tokens", type=int, default=120)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each state")
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = EngineConfig(BackendConfig(args.backend, device=args.device, model=args.model, n_ctx=8192))
    asyncio.run(shoot(config, args.out, args.max_tokens, args.timeout))


if __name__ == "__main__":
    main()
