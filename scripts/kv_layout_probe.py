"""What a prompt over a deep history pays for the cache around it (docs/design/backend.md, issue 23).

Two probes on the default model, CPU, one thread, flash attention, each timing 150 prompt rows at
position 1,300 (six tries, every one kept):
  cells     - the history alone, then beside 6,000 cells of five other sequences;
  relayout  - nine 1,300-token histories built like an agent trace (200-token prompt chunks, then
              100-token replies decoded in lockstep); sequence 0 is then laid out again contiguously
              (kv_save, kv_remove, kv_load) and timed in turn with sequence 1, left as built.
Usage: .venv/bin/python scripts/kv_layout_probe.py docs/benchmarks/kv-layout-probe.json
"""

import json
import os
import sys
import time

from backend.llama_backend import LlamaBackend
from magnitude_bench.common import git_version, load_avg, prompt_tokens
from scheduler.types import BatchPlan, SeqSlice

TRIES = 6


def main(out: str) -> None:
    result: dict = {"command": " ".join(sys.argv), "code": git_version(), "load_before": load_avg(), "probes": {}}
    for probe in ("cells", "relayout"):
        b = LlamaBackend.load(device="cpu", n_ctx=16384, n_seq_max=20, n_batch=512, n_threads=1, flash_attn="on")
        toks = [prompt_tokens(b, 1600, salt=s) for s in range(20)]  # a text per sequence
        steps = [0]

        def run(slices: list[SeqSlice]) -> float:
            steps[0] += 1
            t = time.perf_counter()
            r = b.decode(BatchPlan(steps[0], tuple(slices), 512))
            assert r.outcome.name == "OK", r
            return (time.perf_counter() - t) * 1000

        def timed(seq: int = 0) -> float:
            b.kv_keep_prefix(seq, 1300)
            return round(run([SeqSlice(seq, 1300, toks[seq][1300:1450], True, False)]), 1)

        rows = result["probes"][probe] = {}
        if probe == "cells":
            for pos in range(0, 1300, 260):
                run([SeqSlice(0, pos, toks[0][pos:pos + 260], True, False)])
            rows["alone"] = [timed() for _ in range(TRIES)]
            for s in range(1, 6):
                for pos in range(0, 1200, 300):
                    run([SeqSlice(s, pos, toks[s][pos:pos + 300], True, False)])
            rows["beside 6,000 other cells"] = [timed() for _ in range(TRIES)]
        else:
            seqs = list(range(9))
            for pos in range(0, 1300, 300):
                for s in seqs:
                    run([SeqSlice(s, pos, toks[s][pos:pos + 200], True, False)])
                for k in range(100):
                    run([SeqSlice(s, pos + 200 + k, toks[s][pos + 200 + k:pos + 201 + k], True, False) for s in seqs])
            for s in seqs:
                b.kv_keep_prefix(s, 1300)
            t = time.perf_counter()
            state = b.kv_save(0)
            b.kv_remove(0)
            b.kv_load(0, state)
            rows["relayout_ms"] = round((time.perf_counter() - t) * 1000, 1)
            rows["relayout_mb"] = round(len(state) / 1e6, 1)
            # Turn about: sequence 0 (laid out again) and sequence 1 (as built), the same shape.
            for _ in range(TRIES):
                rows.setdefault("laid out again (seq 0)", []).append(timed(0))
                rows.setdefault("as built (seq 1)", []).append(timed(1))
        b.close()
        print(probe, rows, flush=True)
    result["load_after"] = load_avg()
    result["cpus"] = os.cpu_count()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
