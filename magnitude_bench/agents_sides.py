"""Provides the sides `bench agents` replays a trace against: serve and llama-server over one HTTP client, and the engine directly."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from enum import Enum
from typing import AsyncIterator, Awaitable, Callable, Iterator

import httpx

from magnitude_bench.agents_replay import CallRecord
from magnitude_bench.harness import started
from magnitude_bench.serve_load import chat_body, sse_events
from scheduler.speculation import SpecMode
from scheduler.types import DoneReason, Message, Phase, Priority, Request, SamplingParams, ToolCall


class SideKind(Enum):
    SERVE = "serve"  # this engine behind `serve`, over HTTP
    ENGINE = "engine"  # this engine's EngineClient, no HTTP
    LLAMA_SERVER = "llama-server"  # the vendored llama-server -np N -kvu, over HTTP


# A llama-server side sent serve's own rendering of every history: the same prompts on both sides.
SERVE_PROMPTS = "on serve's prompts"


@dataclass(frozen=True)
class SideSpec:
    kind: SideKind
    cache_reuse: int = 0  # llama-server --cache-reuse N (0: off)
    cache_ram_mib: int = 0  # llama-server --cache-ram MiB (0: off; its own default is 8192)
    # llama-server is sent each history as serve renders it for a template without tool support
    # (calls in the assistant's text, results in <tool_response> user turns), where its own
    # rendering drops the calls: the same prompt tokens on both sides, for a like-for-like figure.
    serve_prompts: bool = False
    # The attention path: "" leaves each side's default (llama-server's -fa auto: flash attention
    # wherever the device has it, the CPU included; the engine's: the path its probe measured
    # faster here); "on" or "off" asks for one (llama-server -fa, the engine's --flash-attn).
    flash_attn: str = ""
    spec: SpecMode | None = None  # the engine's --spec (None: the app's default)
    # A KV cache stream per sequence in place of the unified pool: serve --kv-streams, and
    # llama-server without -kvu (its own default for -np N given).
    kv_streams: bool = False

    @property
    def label(self) -> str:
        parts = (self.kind.value, self.cache_reuse and f"--cache-reuse {self.cache_reuse}",
                 self.cache_ram_mib and f"--cache-ram {self.cache_ram_mib}", self.flash_attn and f"-fa {self.flash_attn}",
                 self.spec and f"--spec {self.spec.value}", self.serve_prompts and SERVE_PROMPTS,
                 self.kv_streams and ("--kv-streams" if self.kind is SideKind.SERVE else "-no-kvu"))
        return " ".join(p for p in parts if p)  # the options that are on

    def server_args(self) -> list[str]:
        # Given after peers.Server's own `-cram 0`: llama.cpp's parser keeps the last value.
        return ((["--cache-reuse", str(self.cache_reuse)] if self.cache_reuse else [])
                + (["--cache-ram", str(self.cache_ram_mib)] if self.cache_ram_mib else [])
                + (["-fa", self.flash_attn] if self.flash_attn else [])
                + (["-no-kvu"] if self.kv_streams else []))


# The names `--sides` takes: llama-server as its users run agents on it (unified KV, cache_prompt),
# with and without the two cache options they reach for; and either side on an attention path
# asked for, or serve without speculation, or either with a KV stream per sequence (reported apart
# from serve as the app launches it).
SIDES = {"serve": SideSpec(SideKind.SERVE), "engine": SideSpec(SideKind.ENGINE),
         "llama-server": SideSpec(SideKind.LLAMA_SERVER),
         "llama-server+reuse": SideSpec(SideKind.LLAMA_SERVER, cache_reuse=256),
         "llama-server+ram": SideSpec(SideKind.LLAMA_SERVER, cache_ram_mib=8192),
         "llama-server+reuse+ram": SideSpec(SideKind.LLAMA_SERVER, cache_reuse=256, cache_ram_mib=8192),
         "llama-server+fa-off": SideSpec(SideKind.LLAMA_SERVER, flash_attn="off"),
         "serve+fa-on": SideSpec(SideKind.SERVE, flash_attn="on"),
         "serve+fa-off": SideSpec(SideKind.SERVE, flash_attn="off"),
         "serve+spec-off": SideSpec(SideKind.SERVE, spec=SpecMode.OFF),
         "llama-server+serve-prompts": SideSpec(SideKind.LLAMA_SERVER, serve_prompts=True),
         "serve+streams": SideSpec(SideKind.SERVE, kv_streams=True),
         "llama-server+streams": SideSpec(SideKind.LLAMA_SERVER, kv_streams=True)}


RESENDS = 2  # as the official openai client: a call the server closed unanswered is sent again


class HttpSide:
    """One OpenAI-style client for every server: the whole history each call, streamed, greedy;
    `user` names the agent (serve keeps one conversation per user; llama-server ignores it and
    matches slots by prompt), `cache_prompt` as llama-server's users send it (serve ignores it)."""

    def __init__(self, name: str, url: str, kv: Callable[[httpx.AsyncClient], Awaitable[tuple[int, int] | None]] | None,
                 pids: tuple[int, ...] = (), rewrite: Callable[[list[dict]], list[dict]] | None = None,
                 attention: Callable[[], str | None] = lambda: None, exact_replies: bool = False) -> None:
        self.name, self.url, self._kv, self.pids, self.rewrite = name, url, kv, pids, rewrite
        self.extra = {"ignore_eos": True} if exact_replies else {}
        self.attention = attention  # the attention path the server ran (known once it is ready)
        self.http: httpx.AsyncClient | None = None
        self.cmd: list[str] | None = None  # a server this side started: its command line

    @asynccontextmanager
    async def session(self) -> AsyncIterator["HttpSide"]:
        # Idle connections are dropped before a server's keep-alive ends (5 s for llama-server's
        # cpp-httplib and uvicorn alike; httpx keeps them 5 s too): a call sent on one the server
        # was closing failed with "Server disconnected without sending a response".
        async with httpx.AsyncClient(base_url=self.url, timeout=1800,
                                     limits=httpx.Limits(keepalive_expiry=2.0)) as http:
            self.http = http
            yield self

    async def call(self, record: CallRecord, messages: list[dict], max_tokens: int) -> None:
        body = chat_body(self.rewrite(messages) if self.rewrite else messages, max_tokens, user=record.conv,
                         cache_prompt=True, **self.extra)
        assert self.http is not None  # calls run inside session()
        for attempt in range(RESENDS + 1):
            answered = False
            try:
                async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
                    answered = True
                    await self._read(record, r)
                return
            except (httpx.RemoteProtocolError, httpx.ConnectError):
                if answered or attempt == RESENDS:
                    raise
                record.resent += 1

    @staticmethod
    async def _read(record: CallRecord, r: httpx.Response) -> None:
        cached, timings = 0, None
        if r.status_code != 200:
            record.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
            return
        async for event in sse_events(r):
            if "error" in event:
                record.error = str(event["error"])[:300]
            for choice in event.get("choices") or []:
                record.by_length = record.by_length or choice.get("finish_reason") == "length"
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    record.t_first = record.t_first or time.perf_counter()
                    record.text += piece
            usage = event.get("usage")
            if usage:
                record.prompt_tokens = usage.get("prompt_tokens", 0)
                record.completion_tokens = usage.get("completion_tokens", 0)
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            timings = event.get("timings") or timings
        # llama-server says what it evaluated (prompt_n); serve says what it found cached.
        record.evaluated = (int(timings["prompt_n"]) if timings and "prompt_n" in timings
                            else record.prompt_tokens - cached)

    async def kv(self) -> tuple[int, int] | None:
        if self._kv is None:
            return None
        assert self.http is not None  # inside session()
        return await self._kv(self.http)


class EngineSide:
    """This engine's EngineClient without HTTP: the same conversations as serve's (one session
    per agent, the whole history each turn), through serve's own event hub."""

    def __init__(self, name: str, client, exact_replies: bool = False) -> None:
        from magnitude_tui.serve.hub import EngineHub

        self.name, self.client, self.exact_replies = name, client, exact_replies
        self.hub = EngineHub(client)
        self.pids = (client.pid,) if client.pid else ()

    def attention(self) -> str | None:
        return engine_attention(self.hub)

    @asynccontextmanager
    async def session(self) -> AsyncIterator["EngineSide"]:
        pump = asyncio.create_task(self.hub.run(wait_s=0.05))
        try:
            yield self
        finally:
            pump.cancel()

    async def call(self, record: CallRecord, messages: list[dict], max_tokens: int) -> None:
        queue: asyncio.Queue = asyncio.Queue()
        self.hub.submit(Request(f"{record.conv}-{record.index}", record.conv, to_messages(messages),
                                SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=self.exact_replies),
                                priority=Priority.AGENT,
                                drop_oldest_turns=False), queue)
        while True:
            _, u, _ = await queue.get()
            if u.text_delta:
                record.t_first = record.t_first or time.perf_counter()
                record.text += u.text_delta
            if u.phase is Phase.DONE:
                record.error = u.error
                record.by_length = u.done_reason is DoneReason.LENGTH
                record.prompt_tokens, record.completion_tokens = u.prompt_total, u.generated
                record.evaluated = u.prompt_total - u.cached_tokens
                return

    async def kv(self) -> tuple[int, int] | None:
        report = self.hub.last_report
        return None if report is None else (report.kv_used, report.kv_total)


def as_serve_renders(messages: list[dict]) -> list[dict]:
    """A history as serve hands it to a chat template without tool support: plain turns."""
    from backend.tools import generic_messages

    return [{"role": m.role, "content": m.content} for m in generic_messages(to_messages(messages), ())]


def to_messages(messages: list[dict]) -> tuple[Message, ...]:
    return tuple(Message(m["role"], m.get("content") or "",
                         tool_calls=tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
                                          for c in m.get("tool_calls") or ()),
                         tool_call_id=m.get("tool_call_id")) for m in messages)


# ---- starting and stopping each side ---------------------------------------------------------------

@dataclass(frozen=True)
class SideSetup:
    """What every side shares: the same model file, threads, context and sequences."""

    backend_kind: str  # "llama", or "fake" (tests)
    model: str | None
    threads: int
    n_ctx: int
    parallel: int  # llama-server -np; the engine's sequences
    in_process: bool = False  # the engine in a thread of this process (tests) instead of a worker
    timeout_s: float = 600.0
    # Every reply runs to its max_tokens (`ignore_eos` on every side): the same tokens generated
    # everywhere, where a reply that ends on its own can end sooner on one side than on another
    # (each side's prompt, and the batch it ran in, decide where greedy decoding ends).
    exact_replies: bool = False


def engine_attention(hub) -> str | None:
    """The attention path an engine's steps run (None until it is ready): its EngineReady says."""
    return hub.ready.info.attention if hub.ready else None


@contextmanager
def open_side(spec: SideSpec, setup: SideSetup) -> Iterator[HttpSide | EngineSide]:
    """A fresh side (server or engine started, model loaded), stopped on exit."""
    if spec.kind is SideKind.LLAMA_SERVER:
        yield from _llama_server(spec, setup)
        return
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig

    # Threads as llama-server's (no automatic choice), so both sides compute on the same cores.
    config = EngineConfig(BackendConfig(kind=setup.backend_kind, model=setup.model, device="cpu", n_ctx=setup.n_ctx,
                                        n_seq_max=setup.parallel, n_threads=setup.threads,
                                        flash_attn=spec.flash_attn or "auto", kv_streams=spec.kv_streams),
                          auto_threads=False)
    if spec.spec is not None:
        config = replace(config, spec=spec.spec)
    if spec.kind is SideKind.SERVE:
        from magnitude_tui.serve.app import ServeOptions
        from magnitude_tui.serve.thread import serve_in_thread

        with serve_in_thread(config, ServeOptions(), in_process=setup.in_process) as s:
            hub = s.hub

            async def kv(_http) -> tuple[int, int] | None:
                r = hub.last_report
                return None if r is None else (r.kv_used, r.kv_total)

            pid = hub.client.pid
            yield HttpSide(spec.label, s.url, kv, (pid,) if pid else (), attention=lambda: engine_attention(hub),
                           exact_replies=setup.exact_replies)
        return
    client = WorkerClient(config, in_process=setup.in_process, log_path=None if setup.in_process else "auto")
    with started(client, setup.timeout_s):
        yield EngineSide(spec.label, client, setup.exact_replies)


def _llama_server(spec: SideSpec, setup: SideSetup) -> Iterator[HttpSide]:
    from magnitude_bench.peers import Server, model_path, required_tools

    with Server.on_cpu(required_tools("llama-server"), model=model_path(setup.model), parallel=setup.parallel,
                       threads=setup.threads, n_ctx=setup.n_ctx, extra=spec.server_args()) as srv:

        async def kv(http: httpx.AsyncClient) -> tuple[int, int] | None:
            # Each slot keeps its last prompt's cells (unified KV: one pool of n_ctx cells).
            r = await http.get("/slots", timeout=5)
            if r.status_code != 200:
                return None
            return sum(int(s.get("n_prompt_tokens") or 0) for s in r.json()), setup.n_ctx

        side = HttpSide(spec.label, f"http://127.0.0.1:{srv.port}", kv, (srv.pid,) if srv.pid else (),
                        rewrite=as_serve_renders if spec.serve_prompts else None,
                        attention=lambda: f"-fa {spec.flash_attn or 'auto'}", exact_replies=setup.exact_replies)
        side.cmd = list(srv.cmd)
        yield side
