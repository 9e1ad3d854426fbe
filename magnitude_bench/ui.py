"""bench ui: the app's responsiveness while N panes stream, and what the UI costs the step loop.

Two measurements on one workload (N panes, one long-answer prompt each, greedy), headless and ui runs
alternating in one invocation: keypress-to-screen latency (ui_keys.py: from handing the app a key as its
terminal driver does to the first frame whose composer row shows it), and the engine's step time
(StepReport.step_ms, measured in the worker) for steps of N decode rows and no prefill, with the app
attached vs the same requests from a bare EngineClient. `bench ui-cpu` (ui_cpu.py) measures the app's
own CPU on a stand-in engine instead, with no model: cheap enough to repeat before and after a change.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from magnitude_bench.harness import client_run, recorded, started
from magnitude_bench.ui_keys import FrameProbe, open_panes, send_key, type_and_time_key, wait_until

# Nothing heavy at import time: the engine, the app and Textual are imported when the benchmark runs.

PROMPTS = (
    "Explain in detail how a CPU cache works.",
    "Write a long story about a robot who learns to paint.",
    "Give a detailed list of tips for writing fast Python code.",
    "Describe the history of the printing press in detail.",
    "Explain how airplanes fly, step by step.",
    "Write a long letter to a friend about a trip to the mountains.",
    "Describe how to bake bread at home, in detail.",
    "Explain the water cycle to a curious child, at length.",
)


@dataclass
class UiConfig:
    panes: int = 8
    max_tokens: int = 96
    keys: int = 30
    key_interval_s: float = 0.12
    reps: int = 2
    threads: tuple = (None,)  # EngineConfig.n_threads per series; None = the engine default
    size: tuple = (160, 50)
    timeout_s: float = 300.0


def prompts(n: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] + (f" (part {i // len(PROMPTS) + 1})" if i >= len(PROMPTS) else "")
            for i in range(n)]


def recording_client(config):
    """A WorkerClient that keeps every StepReport its consumer takes (the app and the headless
    loop both take batches through poll_events)."""
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import StepReport

    class RecordingClient(WorkerClient):
        def __init__(self, config) -> None:
            super().__init__(config)
            self.steps: list[StepReport] = []

        def poll_events(self, timeout: float | None = 0.0):
            batch = super().poll_events(timeout)
            if batch:
                self.steps.extend(e for e in batch if isinstance(e, StepReport))
            return batch

    return RecordingClient(config)


def _shape(steps: list, rows: int) -> dict:
    """step_ms and the step-to-step interval of the steady steps: `rows` decode rows, no prefill."""
    from scheduler.types import DecodeOutcome

    ms = [s.step_ms for s in steps
          if s.decode_rows == rows and s.prefill_rows == 0 and s.outcome is DecodeOutcome.OK]
    gaps = [(b.t - a.t) * 1e3 for a, b in zip(steps, steps[1:])
            if a.decode_rows == b.decode_rows == rows and a.prefill_rows == b.prefill_rows == 0]
    return {"step_ms": ms, "interval_ms": gaps}


def run_headless(config, cfg: UiConfig) -> dict:
    from magnitude_bench.common import Contention
    from scheduler.types import Message, Request, SamplingParams

    client = recording_client(config)
    with started(client, cfg.timeout_s):
        contention, cpu0 = Contention((client.pid,)), time.process_time()
        sampling = SamplingParams(max_tokens=cfg.max_tokens)
        tr = client_run(client, [Request(f"h{i}:0", f"h{i}", (Message("user", text),), sampling)
                                 for i, text in enumerate(prompts(cfg.panes))], cfg.timeout_s, what="headless run: ")
        return {"steps": client.steps, "wall_s": tr.wall_s, "host_cpu_s": time.process_time() - cpu0,
                "others_cores": contention.others_cores(), "keys": []}


async def run_ui(config, cfg: UiConfig) -> dict:
    from magnitude_bench.common import Contention
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.store import Store
    from magnitude_tui.widgets.composer import Composer
    from scheduler.types import Phase, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        client = recording_client(config)
        app = MagnitudeApp(client=client, store=Store(Path(tmp) / "bench.db"), theme="magnitude",
                           sampling=SamplingParams(max_tokens=cfg.max_tokens), export_dir=Path(tmp))
        probe = FrameProbe(app)
        keys: list[dict] = []
        out: dict | None = None
        try:
            async with app.run_test(size=cfg.size) as pilot:
                ws = app.workspace
                deadline = time.monotonic() + cfg.timeout_s  # the engine's start and the panes' replies
                await open_panes(app, pilot, cfg.panes, timeout_s=cfg.timeout_s, poll_s=0.05)
                contention, cpu0, t0 = Contention((client.pid,)), time.process_time(), time.perf_counter()
                for pane, text in zip(ws.grid.panes, prompts(cfg.panes)):
                    composer = pane.query_one(Composer)
                    composer.focus()
                    await asyncio.sleep(0.02)  # not pilot.pause(): it waits for an idle app
                    composer.insert(text)
                    send_key(app, "enter", "\r")
                    await wait_until(lambda: pane.busy or len(pane.record.messages) > 1,  # Submitted is asynchronous
                                     10, f"{pane.record.name} did not take its prompt", poll_s=0.005)
                composer = ws.grid.panes[0].query_one(Composer)
                composer.focus()
                await pilot.pause()
                busy = lambda: sum(p.busy for p in ws.grid.panes)  # noqa: E731
                generating = lambda: sum(1 for p in ws.grid.panes  # noqa: E731
                                         if p.busy and p.replies.last_update is not None
                                         and p.replies.last_update.phase is Phase.GENERATING)
                for i in range(cfg.keys):
                    if i and not busy():
                        break
                    ms = await type_and_time_key(probe, composer, i, timeout_s=5.0, generating=generating())
                    keys.append({"ms": ms, "generating": probe.pending["generating"],
                                 "busy": busy()})
                    await asyncio.sleep(cfg.key_interval_s)
                composer.value = ""
                await wait_until(lambda: not busy(), deadline - time.monotonic(), "the panes did not finish",
                                 pilot.pause)
                wall = time.perf_counter() - t0
                out = {"steps": client.steps, "wall_s": wall, "host_cpu_s": time.process_time() - cpu0,
                       "others_cores": contention.others_cores(), "keys": keys, "frames": probe.frames}
        except asyncio.CancelledError:
            # Was seen on exit while replies streamed through a MarkdownStream task (they no longer
            # do); kept as a guard. The figures were taken before; keep them and say so in the run.
            if out is None:
                raise
            out["teardown_error"] = "CancelledError in the app's teardown"
        return out


@recorded
def run_ui_bench(config, cfg: UiConfig, progress: Callable[[str], None] = lambda s: None):
    """Alternate headless and UI runs of one workload per thread setting; a BenchResult."""
    from magnitude_bench.common import BenchResult, measured
    from scheduler.stats import median, percentile, rnd

    runs: list[dict] = []
    for threads in cfg.threads:
        cfg_t = replace(config, backend=replace(config.backend, n_threads=threads), auto_threads=threads is None)
        for rep in range(cfg.reps):
            for mode in ("headless", "ui"):
                progress(f"threads={threads or 'default'} rep {rep + 1}/{cfg.reps}: {mode}")
                # measured(): wait for a quiet machine first, run again if a neighbour took the CPU.
                r, _ = measured(lambda: run_headless(cfg_t, cfg) if mode == "headless"
                                else asyncio.run(run_ui(cfg_t, cfg)), retries=1, progress=progress)
                runs.append({"threads": threads or "default", "rep": rep + 1, "mode": mode, **r,
                             **_shape(r.pop("steps"), cfg.panes)})
    step_rows, key_rows = [], []
    for threads in dict.fromkeys(r["threads"] for r in runs):
        med = {}
        for mode in ("headless", "ui"):
            rs = [r for r in runs if r["threads"] == threads and r["mode"] == mode]
            ms = [x for r in rs for x in r["step_ms"]]
            gaps = [x for r in rs for x in r["interval_ms"]]
            med[mode] = (median(ms), median(gaps))
            step_rows.append({"threads": threads, "mode": mode, "runs": len(rs), f"steps({cfg.panes}x0)": len(ms),
                              "step_ms_p50": rnd(med[mode][0]), "step_ms_p95": rnd(percentile(ms, 95)),
                              "interval_ms_p50": rnd(med[mode][1]),
                              "per_run_p50": " ".join(f"{median(r['step_ms']) or 0:.1f}" for r in rs),
                              "wall_s": rnd(sum(r["wall_s"] for r in rs) / len(rs)),
                              "host_cores": rnd(sum(r["host_cpu_s"] / r["wall_s"] for r in rs) / len(rs)),
                              "others_cores": rnd(max(r["others_cores"] for r in rs)),
                              "ui/headless": None})
        if med["headless"][0] and med["ui"][0]:
            step_rows[-1]["ui/headless"] = rnd(med["ui"][0] / med["headless"][0], 3)
        lat = [k["ms"] for r in runs if r["threads"] == threads and r["mode"] == "ui" for k in r["keys"]]
        got = [x for x in lat if x is not None]
        allgen = [k["ms"] for r in runs if r["threads"] == threads for k in r["keys"]
                  if k["ms"] is not None and k["generating"] == cfg.panes]
        key_rows.append({"threads": threads, "keys": len(lat), "painted": len(got),
                         f"during_{cfg.panes}_generating": len(allgen),
                         "p50_ms": rnd(percentile(got, 50)), "p95_ms": rnd(percentile(got, 95)),
                         "max_ms": rnd(max(got) if got else None),
                         "p50_ms_all_generating": rnd(percentile(allgen, 50))})
    notes = [
        "keypress-to-screen: from handing the key event to the app (as the terminal driver does) to the first "
        "frame given to the driver whose composer row contains the typed text; frames are rendered to terminal "
        "bytes as a real driver would. Headless Textual: no terminal I/O or terminal-emulator time is included.",
        f"step time: StepReport.step_ms (measured in the engine worker) of steps with {cfg.panes} decode rows and "
        "0 prefill rows; interval = engine-clock time between consecutive such steps (the whole loop).",
        "host_cores: CPU the benchmark's own process used per wall second (the app, or the headless poll loop); "
        "others_cores: CPU used by processes other than this one and its worker.",
    ]
    b = config.backend
    config_out = {**asdict(cfg), "backend": b.kind, "device": b.device, "model": b.model,
                  "n_ctx": b.ctx_size, "policy": config.policy}
    return BenchResult(name="ui", title=f"UI responsiveness, {cfg.panes} panes streaming", config=config_out,
                       tables={"engine step time, UI attached vs headless": step_rows,
                               "keypress-to-screen latency": key_rows},
                       notes=notes, data={"runs": runs})
