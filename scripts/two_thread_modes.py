"""Issue 28: the engine's 2-thread 8-row decode step, four runs in one process.

    python scripts/two_thread_modes.py clear|calib|plain

clear: llama_memory_clear between runs; calib: a fresh calibration before each run; plain: one
calibration, reused. Each run submits 8 prompts of 64 tokens (agents' class, target:50) and makes
32 tokens each; it prints the median native decode step after the first three. Raw results:
docs/benchmarks/issue28-two-thread-modes.json.
"""

from __future__ import annotations

import sys
import time

import llama_cpp

from backend.factory import BackendConfig, build_backend
from magnitude_bench.common import prompt_tokens
from magnitude_bench.harness import Drive
from scheduler.types import Priority, Request, SamplingParams

MODES = ("clear", "calib", "plain")


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in MODES:
        sys.exit(f"usage: python scripts/two_thread_modes.py {'|'.join(MODES)}")
    backend = build_backend(BackendConfig(kind="llama", n_ctx=8192, n_seq_max=16, n_threads=2, device="cpu"))
    params = None
    for run in range(4):
        if mode == "clear" and run > 0:
            llama_cpp.llama_memory_clear(backend._mem, True)
        reuse = params is not None and mode != "calib"
        drive = Drive(backend, policy="target:50", gen_reserve=64, params=params if reuse else None)
        params = drive.params
        sampling = SamplingParams(temperature=0.0, max_tokens=32)
        drive.submit(*[Request(request_id=f"{run}-{i}", session_id=f"{run}-{i}", messages=(), sampling=sampling,
                               prompt_tokens=prompt_tokens(backend, 64, salt=i + 1), priority=Priority.AGENT)
                       for i in range(8)])
        t0 = time.perf_counter()
        while len(drive.trace.done) < 8:
            drive.step()
        steps = sorted(drive.view.decode_ms[3:])
        print(f"{mode} run {run}: wall {time.perf_counter() - t0:.3f} s, step p50 {steps[len(steps) // 2]:.2f} ms",
              flush=True)
        drive.close()


if __name__ == "__main__":
    main()
