"""What a prompt over a deep history pays for the cache around it (docs/design/backend.md, issue 23).

Two probes on the default model, CPU, one thread, flash attention, each timing 150 prompt rows at
position 1,300 of sequence 0 (three tries, every one kept):
  cells     - the history alone, then beside 6,000 cells of five other sequences;
  relayout  - nine 1,300-token histories built like an agent trace (200-token prompt chunks, then
              100-token replies decoded in lockstep), before and after laying sequence 0 out again
              contiguously (kv_save, kv_remove, kv_load).
Usage: .venv/bin/python scripts/kv_layout_probe.py docs/benchmarks/kv-layout-probe.json
"""

import json
import os
import sys
import time

from backend.llama_backend import LlamaBackend
from magnitude_bench.common import git_version, load_avg
from scheduler.types import BatchPlan, SeqSlice


def main(out: str) -> None:
    result: dict = {"command": " ".join(sys.argv), "code": git_version(), "load_before": load_avg(), "probes": {}}
    for probe in ("cells", "relayout"):
        b = LlamaBackend.load(device="cpu", n_ctx=16384, n_seq_max=20, n_batch=512, n_threads=1, flash_attn="on")
        toks = b.tokenize(open("README.md").read()) * 8
        steps = [0]

        def run(slices: list[SeqSlice]) -> float:
            steps[0] += 1
            t = time.perf_counter()
            r = b.decode(BatchPlan(steps[0], tuple(slices), 512))
            assert r.outcome.name == "OK", r
            return (time.perf_counter() - t) * 1000

        def timed() -> list[float]:
            ms = []
            for _ in range(3):
                b.kv_keep_prefix(0, 1300)
                ms.append(round(run([SeqSlice(0, 1300, tuple(toks[1300:1450]), True, False)]), 1))
            return ms

        rows = result["probes"][probe] = {}
        if probe == "cells":
            for pos in range(0, 1300, 260):
                run([SeqSlice(0, pos, tuple(toks[pos:pos + 260]), True, False)])
            rows["alone"] = timed()
            for s in range(1, 6):
                for pos in range(0, 1200, 300):
                    run([SeqSlice(s, pos, tuple(toks[pos + 7:pos + 307]), True, False)])
            rows["beside 6,000 other cells"] = timed()
        else:
            seqs = list(range(9))
            for pos in range(0, 1300, 300):
                for s in seqs:
                    run([SeqSlice(s, pos, tuple(toks[pos:pos + 200]), True, False)])
                for k in range(100):
                    run([SeqSlice(s, pos + 200 + k, (toks[pos + 200 + k],), True, False) for s in seqs])
            for s in seqs:
                b.kv_keep_prefix(s, 1300)
            rows["interleaved history"] = timed()
            t = time.perf_counter()
            state = b.kv_save(0)
            b.kv_remove(0)
            b.kv_load(0, state)
            rows["relayout_ms"] = round((time.perf_counter() - t) * 1000, 1)
            rows["relayout_mb"] = round(len(state) / 1e6, 1)
            rows["laid out again"] = timed()
        b.close()
        print(probe, rows, flush=True)
    result["load_after"] = load_avg()
    result["cpus"] = os.cpu_count()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
