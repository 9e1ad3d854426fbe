"""Paired prefill: two sides (serve, llama-server) at once, each on a core of its own, swapped every
repetition. Each side takes three ~2,300-token reads in one conversation (0 to ~7,000 deep), one
token after each; per repetition: the wall time of the three calls on the client, and the native
prefill time (serve: its steps' step_ms, from the event hub; llama-server: timings.prompt_ms).

    PYTHONPATH=. python docs/experiments/paired-prefill/prefill.py MODEL.gguf serve,llama-server 8

With two serves (`serve,serve`, the control) each side's native time is its reply's
timings.prompt_ms instead: both hubs would report their steps into one list."""
import asyncio
import json
import os
import sys
import time
import uuid
from contextlib import ExitStack

import httpx

from magnitude_bench.agents import pin, threads
from magnitude_bench.agents_sides import SIDES, SideSetup, open_side
from magnitude_bench.serve_load import chat_body, sse_events
from magnitude_tui.engine.events import StepReport
from magnitude_tui.serve.hub import EngineHub

STEPS = []
_orig = EngineHub.dispatch
def _dispatch(self, batch):
    for ev in batch:
        if isinstance(ev, StepReport) and ev.prefill_rows:
            STEPS.append(ev.step_ms)
    return _orig(self, batch)
EngineHub.dispatch = _dispatch

MODEL = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEXTS = [open(os.path.join(ROOT, 'magnitude_tui', 'engine', f'{f}.py')).read()[:9000] for f in ("core", "intake", "worker")]

async def one(url, messages, user):
    t0 = time.perf_counter(); timings = {}; text = ""
    async with httpx.AsyncClient(base_url=url, timeout=1800) as h:
        async with h.stream("POST", "/v1/chat/completions", json=chat_body(messages, 1, user=user, cache_prompt=True, ignore_eos=True)) as r:
            async for ev in sse_events(r):
                for c in ev.get("choices") or []:
                    text += (c.get("delta") or {}).get("content") or ""
                timings = ev.get("timings") or timings
    return time.perf_counter() - t0, timings, text

async def drive(url, tag, is_serve):
    m = [{"role": "system", "content": f"Agent {uuid.uuid4().hex[:8]}."}]
    out = {"wall": 0.0, "native": 0.0}
    for i, t in enumerate(TEXTS):
        m = m + [{"role": "user", "content": "Read this:\n" + t}]
        if is_serve: STEPS.clear()
        wall, timings, text = await one(url, m, tag)
        out["wall"] += wall
        out["native"] += (sum(STEPS) if is_serve else timings.get("prompt_ms", 0.0)) / 1000
        m = m + [{"role": "assistant", "content": text}]
    return {k: round(v, 2) for k, v in out.items()}

def main():
    setup = SideSetup("llama", MODEL, threads=1, n_ctx=16384, parallel=2, exact_replies=True)
    names = sys.argv[2].split(",")
    me = os.getpid(); mine = os.sched_getaffinity(0)
    with ExitStack() as stack:
        sides, started = [], []
        for n in names:
            before = threads(me)
            sides.append(stack.enter_context(open_side(SIDES[n], setup)))
            started.append(threads(me) - before)
        for rep in range(int(sys.argv[3])):
            cores = [0, 1] if rep % 2 == 0 else [1, 0]
            for side, own, core in zip(sides, started, cores):
                pin(own | {t for pid in side.pids for t in threads(pid)}, {core})
            async def both():
                return await asyncio.gather(*(drive(s.url, f"{n}-{i}-{rep}", n == "serve" and names.count("serve") == 1) for i, (s, n) in enumerate(zip(sides, names))))
            outs = asyncio.run(both())
            pin(threads(me), mine)
            print(rep, " ".join(f"{n}@{c} {json.dumps(o)}" for n, c, o in zip(names, cores, outs)),
                  "ratio", {k: round(outs[0][k] / outs[1][k], 3) for k in outs[0] if outs[1][k]}, flush=True)

if __name__ == "__main__":
    main()
