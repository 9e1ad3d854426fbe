"""Provides the priority part of `bench serve`: a person's turn while 16 agents are queued or prefilling."""

from __future__ import annotations

import time

from magnitude_bench.common import PASSAGE
from magnitude_bench.harness import ClientRun, started
from magnitude_tui.engine.events import StepReport
from scheduler.stats import median, rnd
from scheduler.types import Message, Priority, Request, SamplingParams


def _words(n: int, salt: int) -> str:
    words = (PASSAGE * (n // 80 + 3)).split()
    return " ".join(words[salt % 50: salt % 50 + n])


def _request(rid: str, text: str, gen: int, priority: Priority) -> Request:
    return Request(rid, f"s-{rid}", (Message("user", text),), SamplingParams(temperature=0.0, max_tokens=gen),
                   priority=priority)


def run_priority(cfg, *, model: str | None, progress=print) -> list[dict]:
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig

    client = WorkerClient(EngineConfig(BackendConfig(model=model, device="cpu", n_ctx=cfg.n_ctx, n_seq_max=16,
                                                     n_threads=cfg.threads), auto_threads=False))
    rows = []
    with started(client, 300):  # EngineStartFailed with the reason if the model does not load
        # ~50 tokens with the template; each run's texts start differently, so no run reuses
        # another's KV (admission shares any idle conversation's prefix).
        person_text = _words(40, 3) + " What is the keeper's job?"
        run = ClientRun(client)
        progress("priority: the person's turn on an idle engine")
        run.submit(_request("idle-person", "[idle] " + person_text, 8, Priority.INTERACTIVE))
        run.until(lambda: "idle-person" in run.trace.final, 900.0)
        idle = run.trace.final["idle-person"].ttft_ms
        for k, (label, person_class) in enumerate((("with priority classes", Priority.INTERACTIVE),
                                                   ("without (everyone an agent)", Priority.AGENT))):
            progress(f"priority: {cfg.priority_agents} agents, then a person's turn, {label}")
            seen: list = []
            run = ClientRun(client, seen=seen)
            finals = run.trace.final
            agents = {f"agent{k}-{i}" for i in range(cfg.priority_agents)}
            t0 = time.perf_counter()
            run.submit(*(_request(rid, f"[run {k}, agent {i}] " + _words(cfg.priority_agent_words, 17 * i)
                                  + f" Summarise part {i}.", 32, Priority.AGENT)
                         for i, rid in enumerate(sorted(agents))))
            # The person arrives while the agents' prompts are being evaluated.
            run.until(lambda: agents <= set(finals) or any(isinstance(e, StepReport) and e.prefill_rows for e in seen),
                      900.0)
            person = f"person{k}"
            run.submit(_request(person, f"[run {k}] " + person_text, 8, person_class))
            run.until(lambda: agents | {person} <= set(finals), 900.0)
            wall = time.perf_counter() - t0
            reports = [e for e in seen if isinstance(e, StepReport)]
            steps = [s.step_ms for s in reports if s.decode_rows >= 8 and s.prefill_rows == 0]
            step = median(steps) or median([s.step_ms for s in reports if s.decode_rows])
            ttft = finals[person].ttft_ms
            agents_p50 = median(t for a in agents if (t := finals[a].ttft_ms) is not None)
            rows.append({"mode": label, "person_ttft_ms": rnd(ttft, 0), "idle_ttft_ms": rnd(idle, 0),
                         "batch_step_ms": rnd(step, 0),
                         "ttft_minus_idle_in_steps": rnd((ttft - idle) / step if step and ttft is not None
                                                         and idle is not None else None, 1),
                         "agents_ttft_p50_s": rnd(agents_p50 / 1000.0 if agents_p50 is not None else None),
                         "all_done_s": rnd(wall, 1)})
    return rows
