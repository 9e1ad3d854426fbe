"""Throughput at one thread, paired (issue 28): this engine and one llama.cpp peer generate at the
same time, each pinned to a core of its own, the cores swapped every repetition, so a repetition's
ratio comes from the same minutes of a machine whose speed drifts by more than the gap measured.

    PYTHONPATH=. .venv/bin/python docs/experiments/paired-throughput/pair.py server 6 out.json [WIDTH]
    PYTHONPATH=. .venv/bin/python docs/experiments/paired-throughput/pair.py batched-bench 6 out.json [WIDTH]
    POLICY=target:50+defaults PYTHONPATH=. .venv/bin/python docs/experiments/paired-throughput/pair.py server 6 out.json

Each side is a fresh process per repetition (as in `bench throughput`): the engine as `bench
throughput -p target:50` runs it (in process, --spec off, 1 thread, n_ctx 8192, 16 sequence
slots, its attention path by the probe), the peer with `bench throughput`'s flags (unified KV, 1
thread, -c 8192, -b 2048, -ub 512, llama.cpp's default -fa auto; llama-server -np WIDTH). One run:
WIDTH sequences (default 1) sent at once, distinct prompts of PROMPT tokens, exactly GEN generated
each, greedy; tok/s = WIDTH x GEN / wall time from the requests to the last token (prefill
included), as `bench throughput` counts it. Both sides start together once loaded
and warmed up, and each does RUNS runs; the repetition's ratio is the ratio of their medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

PROMPT, GEN = 64, 64
WIDTH = int(sys.argv[4]) if len(sys.argv) > 4 else 1
RUNS = max(4, 12 // WIDTH)  # per side and repetition: about as long at every width
# The engine's policy as `bench throughput -p` takes it: +defaults runs it as the app launches it
# (--spec auto; the thread governor only above one thread, so not here).
POLICY = os.environ.get("POLICY", "target:50")
N_CTX = 8192
READY_S = 40.0  # both sides load and warm up within this; then they start at the same moment


def _wait(start_at: float) -> float:
    late = time.time() - start_at
    if late < 0:
        time.sleep(-late)
    return max(late, 0.0)


def engine_side(core: int, prompts: list[list[int]], start_at: float) -> dict:
    os.sched_setaffinity(0, {core})
    from backend.factory import BackendConfig
    from magnitude_bench.common import loaded
    from magnitude_bench.throughput import engine_run

    with loaded(BackendConfig("llama", device="cpu", n_threads=1, n_ctx=N_CTX)) as backend:
        params = engine_run(backend, [tuple(p) for p in prompts[0]], 8, POLICY)["params"]  # warm-up
        late = _wait(start_at)
        runs = []
        for batch in prompts[1:]:
            r = engine_run(backend, [tuple(p) for p in batch], GEN, POLICY, params=params)
            runs.append({"tok_s": r["tok_s"], "tg_tok_s": r["tg_tok_s"], "made": r["made"]})
        return {"late_s": late, "runs": runs, "attention": backend.info.get("attention")}


def server_side(core: int, prompts: list[list[int]], start_at: float) -> dict:
    os.sched_setaffinity(0, {core})  # the server inherits it; this client's threads run here too
    from magnitude_bench import peers

    bindir, model = peers.required_tools(), peers.model_path(None)
    with peers.Server(bindir, model=model, parallel=WIDTH, threads=1, n_ctx=N_CTX, n_batch=2048, n_ubatch=512,
                      dev=peers.device_args("CPU")) as srv:
        srv.burst(prompts[0], 8)  # warm-up
        late = _wait(start_at)
        runs = []
        for batch in prompts[1:]:
            wall, made = srv.burst(batch, GEN)
            runs.append({"tok_s": made / wall, "made": made})
        return {"late_s": late, "runs": runs}


def batched_side(core: int, prompts: list[list[int]], start_at: float) -> dict:
    os.sched_setaffinity(0, {core})
    from magnitude_bench import peers

    bindir, model = peers.required_tools(), peers.model_path(None)
    late = _wait(start_at)
    runs = []
    for _ in prompts[1:]:  # llama-batched-bench makes its own prompt; a fresh load each run (not timed)
        row = peers.batched_bench(bindir, model=model, seqs=[WIDTH], prompt=PROMPT, gen=GEN, threads=1, n_ctx=N_CTX,
                                  n_batch=2048, n_ubatch=512, dev=peers.device_args("CPU"))[WIDTH]
        runs.append({"tok_s": WIDTH * GEN / row["t"], "tg_tok_s": row["speed_tg"], "made": WIDTH * GEN})
    return {"late_s": late, "runs": runs}


PEERS = {"server": server_side, "batched-bench": batched_side}


def main() -> None:
    peer, reps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("a paired run needs two cores")
    from backend.factory import BackendConfig
    from magnitude_bench.common import loaded, prompt_tokens

    with loaded(BackendConfig("llama", device="cpu", n_threads=1, n_ctx=512, n_seq_max=1, flash_attn="on")) as b:
        prompts = [[list(prompt_tokens(b, PROMPT, salt=run * WIDTH + i + 1)) for i in range(WIDTH)]
                   for run in range(RUNS + 1)]
    doc: dict = {"peer": peer, "width": WIDTH, "policy": POLICY, "prompt": PROMPT, "gen": GEN, "runs_per_rep": RUNS,
                 "n_ctx": N_CTX, "reps": []}
    for rep in range(reps):
        engine_core, peer_core = (cores[0], cores[1]) if rep % 2 == 0 else (cores[1], cores[0])
        start_at = time.time() + READY_S
        with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
            e = pool.submit(engine_side, engine_core, prompts, start_at)
            p = pool.submit(PEERS[peer], peer_core, prompts, start_at)
            eng, other = e.result(), p.result()
        ratio = (statistics.median(r["tok_s"] for r in eng["runs"])
                 / statistics.median(r["tok_s"] for r in other["runs"]))
        doc["reps"].append({"rep": rep, "engine_core": engine_core, "peer_core": peer_core, "engine": eng,
                            "peer_side": other, "ratio": round(ratio, 3)})
        print(f"rep {rep + 1}/{reps}: engine on core {engine_core} "
              f"{statistics.median(r['tok_s'] for r in eng['runs']):.1f} tok/s, {peer} on core {peer_core} "
              f"{statistics.median(r['tok_s'] for r in other['runs']):.1f}: ratio {ratio:.3f} "
              f"(late {eng['late_s']:.1f}/{other['late_s']:.1f} s)", flush=True)
    ratios = [r["ratio"] for r in doc["reps"]]
    doc["median_ratio"] = round(statistics.median(ratios), 3)
    doc["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{peer}, width {WIDTH}, engine {POLICY}: engine ÷ peer per repetition {ratios}, "
          f"median {doc['median_ratio']}")


if __name__ == "__main__":
    main()
