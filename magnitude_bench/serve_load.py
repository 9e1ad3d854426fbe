"""Provides `bench serve`: concurrent HTTP clients against `serve` and llama-server, the admission
stall over HTTP, and a person's turn behind 16 agents with and without priority classes."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import AsyncIterator, Iterator

import httpx

from magnitude_bench.common import PASSAGE, BenchResult
from magnitude_bench.harness import in_turn, recorded
from magnitude_bench.peers import Server, model_path, tools_dir
from magnitude_bench.remote import TOPICS
from scheduler.stats import median, percentile, rnd


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
    # Repetitions of the clients part, alternating which peer goes first (a shared machine's load
    # drifts: side by side, repeated, the ratio means something where one pass's absolutes do not).
    reps: int = 1
    parts: tuple[str, ...] = ("clients", "admission", "priority")


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

    @property
    def ended(self) -> float:
        """When the call ended (stream_call returns only ended calls)."""
        assert self.t_end is not None, "the call has not ended"
        return self.t_end


def chat_body(messages: list[dict], max_tokens: int, **extra) -> dict:
    """A streamed, greedy chat completion request that asks for the usage at the end."""
    return {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


async def sse_events(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON events of an OpenAI-style event stream (its `data: ` lines, less `data: [DONE]`)."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def stream_call(http: httpx.AsyncClient, messages: list[dict], max_tokens: int, *,
                      call: Call | None = None) -> Call:
    """Stream one call; `call` (if given) fills in as deltas arrive, for callers watching it."""
    call = call or Call(t_send=time.perf_counter())
    call.t_send = time.perf_counter()
    counted = 0
    try:
        async with http.stream("POST", "/v1/chat/completions", json=chat_body(messages, max_tokens)) as r:
            if r.status_code != 200:
                call.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                call.t_end = time.perf_counter()  # a refused call ended too (the run's wall time reads it)
                return call
            async for event in sse_events(r):
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


def burst_prompt(rep: int, n: int, i: int) -> list[dict]:
    """Call `i` of a burst of `n` in repetition `rep`: numbered per repetition, width and call (each
    under 1,000), so no call of a run finds another's prompt in the server's cache."""
    return story((rep * 1000 + n) * 1000 + i)


async def _burst(url: str, n: int, gen: int, rep: int = 0) -> list[Call]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        return list(await asyncio.gather(*(stream_call(http, burst_prompt(rep, n, i), gen)
                                           for i in range(n))))


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
    window = (newcomer.t_send, newcomer.t_first or newcomer.ended)
    gaps = [b - a for c in calls for a, b in zip(c.delta_times, c.delta_times[1:]) if b > window[0] and a < window[1]]
    return {"newcomer_ttft_s": rnd(newcomer.ttft_ms / 1000.0 if newcomer.ttft_ms else None),
            "running_max_gap_s": rnd(max(gaps) if gaps else None),
            "running_gen_tok_s": rnd(sum(c.tokens for c in calls) / max(1e-9, max(c.ended for c in calls) - min(c.t_send for c in calls)))}


def _row(peer: str, n: int, calls: list[Call]) -> dict:
    wall = max(c.ended for c in calls) - min(c.t_send for c in calls)
    ttfts = [c.ttft_ms for c in calls if c.ttft_ms is not None]
    return {"peer": peer, "clients": n, "tokens": sum(c.tokens for c in calls),
            "agg_tok_s": rnd(sum(c.tokens for c in calls) / wall), "ttft_p50_ms": rnd(percentile(ttfts, 50), 0),
            "ttft_p95_ms": rnd(percentile(ttfts, 95), 0), "errors": sum(c.error is not None for c in calls)}


@recorded
def run_serve_bench(cfg: ServeBenchConfig, *, model: str | None, progress=print) -> BenchResult:
    from backend.factory import BackendConfig
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.serve.app import ServeOptions
    from magnitude_tui.serve.thread import serve_in_thread

    result = BenchResult("serve", "serve: HTTP clients against this engine and llama-server", asdict(cfg))
    rows: list[dict] = []
    admission: list[dict] = []
    found = tools_dir() if "llama-server" in cfg.peers else None
    if "llama-server" in cfg.peers and found is None:
        result.notes.append("llama-server not built (scripts/build_llama_tools.sh): peer left out")

    config = EngineConfig(BackendConfig(model=model, device="cpu", n_ctx=cfg.n_ctx, n_seq_max=16,
                                        n_threads=cfg.threads), auto_threads=False)  # as the peer's
    http_parts = {"clients", "admission"} & set(cfg.parts)  # the priority part runs its own engine
    with (serve_in_thread(config, ServeOptions(), in_process=False) if "serve" in cfg.peers and http_parts
          else nullcontext()) as s:

        @contextmanager
        def side(name: str, parallel: int) -> Iterator[tuple[str, str]]:
            """(label, url) of a side for `parallel` calls: serve, started once, or a fresh llama-server -np N."""
            if name == "serve":
                assert s is not None
                yield "serve (this engine)", s.url
            else:  # on the same model and threads
                assert found is not None
                with Server.on_cpu(found[0], model=model_path(model), parallel=parallel, threads=cfg.threads,
                                   n_ctx=cfg.n_ctx) as srv:
                    yield f"llama-server -np {parallel}", srv.process.url

        sides = (["serve"] if s is not None else []) + (["llama-server"] if found is not None else [])
        if "clients" in cfg.parts:
            for rep in range(cfg.reps):
                for n in cfg.seqs:
                    for name in in_turn(sides, rep):
                        progress(f"{name}: {n} clients (repetition {rep + 1} of {cfg.reps})")
                        with side(name, n) as (label, url):
                            calls = asyncio.run(_burst(url, n, cfg.gen, rep))
                        rows.append({**_row(label, n, calls), "rep": rep + 1})
        if "admission" in cfg.parts:
            admit = (cfg.admit_running, cfg.gen * 3, cfg.admit_prompt_words)
            for name in sides:
                progress(f"{name}: admission")
                with side(name, cfg.admit_running + 1) as (label, url):
                    admission.append({"peer": label, **asyncio.run(_admission(url, *admit))})
    if "clients" in cfg.parts:
        result.tables["concurrent clients"] = rows
        serve_ratios(result, rows)
    if "admission" in cfg.parts:
        result.tables["a long prompt arrives over HTTP while 8 stream"] = admission
    if "serve" in cfg.peers and "priority" in cfg.parts:
        from magnitude_bench.serve_priority import run_priority

        result.tables["a person's turn behind agents"] = run_priority(cfg, model=model, progress=progress)
    return result


def serve_ratios(result: BenchResult, rows: list[dict]) -> None:
    """serve ÷ llama-server aggregate tok/s per width: each repetition's, and their median."""
    for n in sorted({r["clients"] for r in rows}):
        ratios = []
        for rep in sorted({r.get("rep", 1) for r in rows}):
            ours = [r for r in rows if r["clients"] == n and r.get("rep", 1) == rep and r["peer"].startswith("serve")]
            theirs = [r for r in rows if r["clients"] == n and r.get("rep", 1) == rep
                      and r["peer"].startswith("llama-server")]
            if ours and theirs and theirs[0]["agg_tok_s"]:
                ratios.append(ours[0]["agg_tok_s"] / theirs[0]["agg_tok_s"])
        if ratios:
            each = ", ".join(f"{x:.2f}" for x in ratios)
            result.notes.append(f"{n} clients: serve / llama-server aggregate tok/s = {median(ratios):.2f}x"
                                + (f" (median of {len(ratios)} alternating repetitions: {each})"
                                   if len(ratios) > 1 else ""))
