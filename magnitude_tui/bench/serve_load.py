"""Provides `bench serve`: concurrent HTTP clients against `serve` and llama-server, the admission
stall over HTTP, and a person's turn behind 16 agents with and without priority classes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from magnitude_tui.bench.common import PASSAGE, BenchResult, machine_info, percentile, rnd
from magnitude_tui.bench.remote import TOPICS


@dataclass(frozen=True)
class ServeBenchConfig:
    seqs: tuple[int, ...] = (1, 4, 8)
    gen: int = 48
    threads: int = 2
    n_ctx: int = 8192
    admit_running: int = 8
    admit_prompt_words: int = 700  # the newcomer's message (~1,000 tokens with the template)
    priority_agents: int = 16
    priority_agent_words: int = 150
    peers: tuple[str, ...] = ("serve", "llama-server")


@dataclass
class Call:
    """One streamed call, timed on the client."""

    t_send: float
    t_first: float | None = None
    t_end: float | None = None
    delta_times: list[float] = field(default_factory=list)
    tokens: int = 0
    cached: int | None = None
    error: str | None = None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.t_first is None else (self.t_first - self.t_send) * 1000.0


async def stream_call(http: httpx.AsyncClient, messages: list[dict], max_tokens: int, *,
                      call: Call | None = None) -> Call:
    """Stream one call; `call` (if given) fills in as deltas arrive, for callers watching it."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    call = call or Call(t_send=time.perf_counter())
    call.t_send = time.perf_counter()
    counted = 0
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                call.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return call
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                now = time.perf_counter()
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        call.t_first = call.t_first or now
                        call.delta_times.append(now)
                        counted += 1
                usage = event.get("usage")
                if usage:
                    call.tokens = usage.get("completion_tokens", 0)
                    call.cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except httpx.HTTPError as e:
        call.error = str(e)
    call.t_end = time.perf_counter()
    call.tokens = call.tokens or counted
    return call


def story(i: int, words: int = 0) -> list[dict]:
    """Distinct prompts (no shared prefix beyond the template) that ask for a long answer."""
    text = f"Story {i}: write a long, detailed story about {TOPICS[i % len(TOPICS)]}."
    if words:
        text = " ".join((PASSAGE * (words // 80 + 2)).split()[i * 7: i * 7 + words]) + "\n\n" + text
    return [{"role": "user", "content": text}]


async def _burst(url: str, n: int, gen: int) -> list[Call]:
    # Numbered per width, so no width finds another's replies in the cache.
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        return list(await asyncio.gather(*(stream_call(http, story(100 * n + i), gen) for i in range(n))))


async def _admission(url: str, running: int, gen: int, words: int) -> dict:
    """`running` calls stream; once all have their first token a long prompt arrives."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        watched = [Call(t_send=time.perf_counter()) for _ in range(running)]
        runners = [asyncio.ensure_future(stream_call(http, story(i), gen, call=c)) for i, c in enumerate(watched)]
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 120 and not all(c.t_first or c.t_end for c in watched):
            await asyncio.sleep(0.05)
        newcomer = await stream_call(http, story(99, words), 8)
        calls = await asyncio.gather(*runners)
    window = (newcomer.t_send, newcomer.t_first or newcomer.t_end)
    gaps = [b - a for c in calls for a, b in zip(c.delta_times, c.delta_times[1:]) if b > window[0] and a < window[1]]
    return {"newcomer_ttft_s": rnd(newcomer.ttft_ms / 1000.0 if newcomer.ttft_ms else None),
            "running_max_gap_s": rnd(max(gaps) if gaps else None),
            "running_gen_tok_s": rnd(sum(c.tokens for c in calls) / max(1e-9, max(c.t_end for c in calls) - min(c.t_send for c in calls)))}


def _row(peer: str, n: int, calls: list[Call]) -> dict:
    wall = max(c.t_end for c in calls) - min(c.t_send for c in calls)
    ttfts = [c.ttft_ms for c in calls if c.ttft_ms is not None]
    return {"peer": peer, "clients": n, "tokens": sum(c.tokens for c in calls),
            "agg_tok_s": rnd(sum(c.tokens for c in calls) / wall), "ttft_p50_ms": rnd(percentile(ttfts, 50), 0),
            "ttft_p95_ms": rnd(percentile(ttfts, 95), 0), "errors": sum(c.error is not None for c in calls)}


def run_serve_bench(cfg: ServeBenchConfig, *, model: str | None, progress=print) -> BenchResult:
    from backend.factory import BackendConfig
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.serve.app import ServeOptions
    from magnitude_tui.serve.thread import serve_in_thread

    result = BenchResult("serve", "serve: HTTP clients against this engine and llama-server",
                         asdict(cfg), machine_info())
    rows: list[dict] = []
    admission: list[dict] = []
    if "serve" in cfg.peers:
        config = EngineConfig(BackendConfig(model=model, device="cpu", n_ctx=cfg.n_ctx, n_seq_max=16,
                                            n_threads=cfg.threads), auto_threads=False)  # as the peers'
        with serve_in_thread(config, ServeOptions(), in_process=False) as s:
            for n in cfg.seqs:
                progress(f"serve: {n} clients")
                rows.append(_row("serve (this engine)", n, asyncio.run(_burst(s.url, n, cfg.gen))))
            progress("serve: admission")
            admission.append({"peer": "serve (this engine)",
                              **asyncio.run(_admission(s.url, cfg.admit_running, cfg.gen * 3, cfg.admit_prompt_words))})
    if "llama-server" in cfg.peers:
        from backend.llama_backend import default_model_path
        from magnitude_tui.bench.peers import Server, device_args, tools_dir

        found = tools_dir()
        if found is None:
            result.notes.append("llama-server not built (scripts/build_llama_tools.sh): peer left out")
        else:
            path = model or default_model_path()
            for n in cfg.seqs:
                progress(f"llama-server -np {n}: {n} clients")
                with Server(found[0], model=path, parallel=n, threads=cfg.threads, n_ctx=cfg.n_ctx, n_batch=2048,
                            n_ubatch=512, dev=device_args("CPU")) as srv:
                    rows.append(_row(f"llama-server -np {n}", n,
                                     asyncio.run(_burst(f"http://127.0.0.1:{srv.port}", n, cfg.gen))))
            progress("llama-server: admission")
            with Server(found[0], model=path, parallel=cfg.admit_running + 1, threads=cfg.threads, n_ctx=cfg.n_ctx,
                        n_batch=2048, n_ubatch=512, dev=device_args("CPU")) as srv:
                admission.append({"peer": f"llama-server -np {cfg.admit_running + 1}",
                                  **asyncio.run(_admission(f"http://127.0.0.1:{srv.port}", cfg.admit_running,
                                                           cfg.gen * 3, cfg.admit_prompt_words))})
    result.tables["concurrent clients"] = rows
    _ratios(result, rows)
    result.tables["a long prompt arrives over HTTP while 8 stream"] = admission
    if "serve" in cfg.peers:
        from magnitude_tui.bench.serve_priority import run_priority

        result.tables["a person's turn behind agents"] = run_priority(cfg, model=model, progress=progress)
    return result


def _ratios(result: BenchResult, rows: list[dict]) -> None:
    ours = {r["clients"]: r for r in rows if r["peer"].startswith("serve")}
    for r in rows:
        if r["peer"].startswith("llama-server") and r["clients"] in ours and r["agg_tok_s"]:
            result.notes.append(f"{r['clients']} clients: serve / llama-server aggregate tok/s = "
                                f"{ours[r['clients']]['agg_tok_s'] / r['agg_tok_s']:.2f}x")
