"""Throughput at two threads, in turns (issue 28): a paired run needs a core per side, and at two
threads each side needs both, so here the sides take turns instead. The engine (in a process of its
own, loaded once) and the peer (llama-server, loaded once; or llama-batched-bench, a fresh load per
run) each run the same WIDTH prompts in turn, a second's rest between runs (so neither side's idle
threads are still spinning when the other starts), the order rotated every round, so each round's
ratios come from the same few seconds of a machine whose speed drifts over minutes.

    PYTHONPATH=. .venv/bin/python docs/experiments/paired-throughput/turns.py server 12 out.json WIDTH [THREADS]
    PYTHONPATH=. .venv/bin/python docs/experiments/paired-throughput/turns.py batched-bench 12 out.json WIDTH

Each round runs the engine as `bench throughput -p target:50` runs it (--spec off, in process, the
attention path its probe chose) and as `-p target:50+defaults` (the app's launch defaults: --spec
auto and the thread governor), and the peer with `bench throughput`'s flags (unified KV, -c 8192
-b 2048 -ub 512, llama.cpp's default -fa auto; llama-server -np WIDTH). One run: WIDTH distinct
64-token prompts sent at once, exactly 64 tokens generated each, greedy; tok/s = WIDTH x 64 / wall
time from the requests to the last token (prefill included), as `bench throughput` counts it.
A round's ratio is engine ÷ peer within the round; the figure is the median over rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from multiprocessing import get_context

PROMPT, GEN = 64, 64
N_CTX = 8192
REST_S = 1.0
POLICIES = ("target:50", "target:50+defaults")


def engine_worker(conn, threads: int) -> None:
    from backend.factory import BackendConfig
    from magnitude_bench.common import loaded
    from magnitude_bench.throughput import engine_run

    with loaded(BackendConfig("llama", device="cpu", n_threads=threads, n_ctx=N_CTX)) as backend:
        params = None
        while True:
            msg = conn.recv()
            if msg is None:
                return
            batch, policy, gen = msg
            r = engine_run(backend, [tuple(p) for p in batch], gen, policy, params=params)
            params = params or r["params"]  # calibrated once, at the warm-up
            conn.send({"tok_s": r["tok_s"], "tg_tok_s": r["tg_tok_s"], "made": r["made"],
                       "attention": backend.info.get("attention")})


def main() -> None:
    peer, rounds, out, width = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    from backend.factory import BackendConfig
    from magnitude_bench import peers
    from magnitude_bench.common import loaded, prompt_tokens

    with loaded(BackendConfig("llama", device="cpu", n_threads=1, n_ctx=512, n_seq_max=1, flash_attn="on")) as b:
        prompts = [[list(prompt_tokens(b, PROMPT, salt=run * width + i + 1)) for i in range(width)]
                   for run in range(rounds + 1)]
    bindir, model = peers.required_tools(), peers.model_path(None)
    ctx = get_context("spawn")
    mine, theirs = ctx.Pipe()
    worker = ctx.Process(target=engine_worker, args=(theirs, threads), daemon=True)
    worker.start()

    def engine(batch, policy, gen=GEN) -> dict:
        mine.send((batch, policy, gen))
        return mine.recv()

    server = None
    if peer == "server":
        server = peers.Server(bindir, model=model, parallel=width, threads=threads, n_ctx=N_CTX, n_batch=2048,
                              n_ubatch=512, dev=peers.device_args("CPU"))
        server.__enter__()

    def run_peer(batch) -> dict:
        if server is not None:
            wall, made = server.burst(batch, GEN)
            return {"tok_s": made / wall, "made": made}
        row = peers.batched_bench(bindir, model=model, seqs=[width], prompt=PROMPT, gen=GEN, threads=threads,
                                  n_ctx=N_CTX, n_batch=2048, n_ubatch=512, dev=peers.device_args("CPU"))[width]
        return {"tok_s": width * GEN / row["t"], "tg_tok_s": row["speed_tg"], "made": width * GEN}

    doc: dict = {"peer": peer, "width": width, "threads": threads, "prompt": PROMPT, "gen": GEN, "n_ctx": N_CTX,
                 "rest_s": REST_S, "policies": list(POLICIES), "rounds": []}
    try:
        for policy in POLICIES:  # warm-up (the engine's cost model is calibrated here)
            engine(prompts[0], policy, 8)
        if server is not None:
            server.burst(prompts[0], 8)
        sides = [*POLICIES, "peer"]
        for rnd in range(rounds):
            order = sides[rnd % 3:] + sides[:rnd % 3]
            if rnd % 2:
                order.reverse()
            got: dict = {}
            for side in order:
                time.sleep(REST_S)
                batch = prompts[rnd + 1]
                got[side] = run_peer(batch) if side == "peer" else engine(batch, side)
            ratios = {p: round(got[p]["tok_s"] / got["peer"]["tok_s"], 4) for p in POLICIES}
            doc["rounds"].append({"round": rnd, "order": order, "runs": got, "ratios": ratios})
            print(f"round {rnd + 1}/{rounds} ({', '.join(order)}): "
                  + ", ".join(f"{s} {got[s]['tok_s']:.1f}" for s in sides)
                  + " tok/s; engine ÷ peer " + ", ".join(f"{p} {r:.3f}" for p, r in ratios.items()), flush=True)
    finally:
        mine.send(None)
        worker.join(10)
        if server is not None:
            server.__exit__(None, None, None)
    doc["median_ratio"] = {p: round(statistics.median(r["ratios"][p] for r in doc["rounds"]), 3) for p in POLICIES}
    doc["attention"] = doc["rounds"][0]["runs"][POLICIES[0]]["attention"] if doc["rounds"] else None
    doc["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc["cpu"] = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{peer}, width {width}, {threads} threads: engine ÷ peer, median over {rounds} rounds: {doc['median_ratio']}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", ".")
    main()
