"""Provides `bench remote`: client-side aggregate tok/s and TTFT of N concurrent sequences on an
OpenAI-compatible server, optionally beside the local engine on the same work.

Both engines are driven through the same EngineClient interface with the same requests (greedy,
the same prompts and max_tokens), so the figures compare what a user of the app would get.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from magnitude_tui.bench.common import BenchResult, machine_info, median, percentile, rnd
from magnitude_tui.engine.events import EngineFailed, EngineReady
from magnitude_tui.engine.protocol import EngineClient
from scheduler.types import Message, Phase, Request, SamplingParams, SeqUpdate, StepReport

TOPICS = ("the sea", "a mountain town", "a lighthouse keeper", "an old library", "a winter market",
          "a river boat", "a night train", "a bakery at dawn", "a garden in autumn", "a desert road",
          "a fishing village", "a clock maker", "a snowy pass", "a city park", "an island ferry",
          "a harvest festival")


@dataclass(frozen=True)
class RemoteBenchConfig:
    seqs: tuple[int, ...] = (1, 4, 8)
    gen: int = 64  # max_tokens per sequence (greedy; a model may stop earlier, counted as made)
    reps: int = 1
    timeout_s: float = 600.0


def _requests(n: int, cfg: RemoteBenchConfig, tag: str) -> list[Request]:
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.gen, seed=1)
    return [Request(f"{tag}-{i}", f"{tag}-s{i}",
                    (Message("user", f"Write a long, detailed story about {TOPICS[i % len(TOPICS)]}."),),
                    sampling) for i in range(n)]


def wait_ready(client: EngineClient, timeout_s: float) -> EngineReady:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in client.poll_events(0.5) or ():
            if isinstance(event, EngineReady):
                return event
            if isinstance(event, EngineFailed):
                raise RuntimeError(event.message)
    raise RuntimeError(f"the engine was not ready within {timeout_s:g} s")


def run_burst(client: EngineClient, requests: list[Request], timeout_s: float) -> dict:
    """Submit every request at once; wall time to the last done, tokens made, TTFTs."""
    finals: dict[str, SeqUpdate] = {}
    t0 = time.perf_counter()
    for r in requests:
        client.submit(r)
    deadline = time.monotonic() + timeout_s
    while len(finals) < len(requests):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(requests) - len(finals)} of {len(requests)} requests did not finish")
        for event in client.poll_events(0.5) or ():
            updates = event.updates if isinstance(event, StepReport) else [event] if isinstance(event, SeqUpdate) else []
            for u in updates:
                if u.phase is Phase.DONE:
                    if u.error:
                        raise RuntimeError(f"{u.request_id} failed: {u.error}")
                    finals[u.request_id] = u
    wall = time.perf_counter() - t0
    made = sum(f.generated for f in finals.values())
    ttfts = [f.ttft_ms for f in finals.values() if f.ttft_ms is not None]
    return {"wall_s": wall, "made": made, "tok_s": made / wall, "ttft_p50_ms": median(ttfts),
            "ttft_p95_ms": percentile(ttfts, 95), "queue_p50_ms": median([f.queue_ms or 0.0 for f in finals.values()]),
            "estimated": any(f.tokens_estimated for f in finals.values())}


def bench_engines(engines: dict[str, EngineClient], cfg: RemoteBenchConfig, progress=lambda s: None) -> BenchResult:
    """Every engine, every width, `reps` times (engines alternate within a width); medians."""
    runs: list[dict] = []
    ready = {}
    for name, client in engines.items():
        client.start()
        ready[name] = wait_ready(client, cfg.timeout_s)
    try:
        for n in cfg.seqs:
            for rep in range(cfg.reps):
                for name, client in engines.items():
                    progress(f"{name}: {n} sequences, rep {rep + 1}/{cfg.reps}")
                    r = run_burst(client, _requests(n, cfg, f"{name}-{n}-{rep}"), cfg.timeout_s)
                    runs.append({"engine": name, "seqs": n, "rep": rep + 1, **r})
    finally:
        for client in engines.values():
            client.stop()
    rows = []
    names = list(engines)
    for n in cfg.seqs:
        row: dict = {"seqs": n}
        for name in names:
            rs = [r for r in runs if r["engine"] == name and r["seqs"] == n]
            row[f"{name} tok/s"] = rnd(median(r["tok_s"] for r in rs), 1)
            row[f"{name} TTFT p50 ms"] = rnd(median(r["ttft_p50_ms"] for r in rs), 0)
            row[f"{name} TTFT p95 ms"] = rnd(median(r["ttft_p95_ms"] for r in rs), 0)
        if len(names) == 2 and row[f"{names[1]} tok/s"]:
            row[f"{names[0]}/{names[1]}"] = rnd(row[f"{names[0]} tok/s"] / row[f"{names[1]} tok/s"], 2)
        rows.append(row)
    notes = ["Every figure is measured on the client: tok/s = tokens generated by all sequences / wall time "
             "from the first submit to the last reply; TTFT = request sent to its first content delta "
             "(remote) or submit to first token (local).",
             "Greedy, same prompts and max_tokens for every engine; a reply that ends early counts what it made."]
    if any(r["estimated"] for r in runs):
        notes.append("Some token counts are tiktoken estimates: that server sent no usage.")
    return BenchResult(name="remote", title="bench remote: client-side throughput and TTFT",
                       config={"bench": asdict(cfg), "engines": {n: {"model": r.model, "device": r.device}
                                                               for n, r in ready.items()}},
                       machine=machine_info(), tables={"aggregate tok/s and TTFT": rows}, data={"runs": runs})
