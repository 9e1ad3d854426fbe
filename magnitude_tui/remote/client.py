"""Provides RemoteClient: the EngineClient of a remote engine, i.e. OpenAI-compatible servers
(vLLM, SGLang, one or several llama-servers) streaming `/v1/chat/completions`.

The server schedules; the client measures what it can see. Requests run as tasks on an asyncio
loop in a thread of their own; updates are collected and handed out in batches (at most one per
FLUSH_S), so the app takes them exactly as it takes a local engine's step reports.
"""

from __future__ import annotations

import asyncio
import threading

import httpx

from magnitude_tui.engine.events import (
    CommandRejected,
    EndpointsReport,
    EngineFailed,
    EngineInfo,
    EngineReady,
    LoadProgress,
    RemoteFacts,
    RestoreOutcome,
    SeqUpdate,
    SessionRestored,
)
from magnitude_tui.engine.protocol import EngineEvent, EngineTarget, EventStream
from magnitude_tui.remote.config import RemoteConfig, base_url
from magnitude_tui.remote.metrics import RemoteSeq
from magnitude_tui.remote.pool import EndpointPool
from magnitude_tui.remote.request import RequestFailed, error_message, run_request
from scheduler.budget import Policy
from scheduler.speculation import SpecMode
from scheduler.types import DoneReason, Message, Phase, Request

KEEPALIVE_S = 4.0  # an idle connection is closed after this long (llama-server closes its own after 5 s)
FLUSH_S = 0.02  # updates gathered this long go out as one batch
STATUS_S = 0.5  # the endpoints' figures are sent at most this often


def unlisted_model(model: str | None, endpoints) -> str | None:
    """What to tell the user when --remote-model names a model some server's /v1/models does not
    list, else None. Not a failure: a server that serves one model whatever a request calls it
    (llama-server) answers, and one that checks the name says so with a 404 naming its models."""
    if model is None:
        return None
    missing = [e for e in endpoints if e.models and model not in e.models]
    if not missing:
        return None
    where = "; ".join(f"{e.url} lists {', '.join(repr(m) for m in e.models)}" for e in missing)
    return (f"--remote-model {model!r} is not among the models listed ({where}). Requests still ask for "
            f"{model!r}: a server that serves one model whatever it is called (llama-server) answers them, "
            "one that checks the name refuses them (404); choose a listed name with --remote-model")


class RemoteClient:
    """Sends each request to the least-loaded healthy server and streams its reply back."""

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.model: str | None = config.model
        self.pool = EndpointPool(config.urls, config.max_in_flight)
        self._events = EventStream()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._http: httpx.AsyncClient | None = None
        self._ready = False
        self._failed = False
        self._seqs: dict[str, RemoteSeq] = {}  # live requests, until their done update is out
        self._tasks: dict[str, asyncio.Task] = {}
        self._early: list[Request] = []  # submitted before the servers answered
        self._home: dict[str, str] = {}  # session id -> the server its last turn ran on
        self._changed: dict[str, RemoteSeq] = {}
        self._pending: list[EngineEvent] = []
        self._status_dirty = True

    # ---- EngineClient ------------------------------------------------------------------------

    @property
    def target(self) -> EngineTarget:
        return EngineTarget(model=self.config.model or "", where=", ".join(self.config.urls))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._failed

    def start(self) -> None:
        self._ready = self._failed = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="remote-engine", daemon=True)
        self._thread.start()
        ready.wait(5)

    def restart(self) -> None:
        self._shutdown()
        for e in self.pool.endpoints:
            e.healthy = True  # everyone gets asked again
        self.start()

    def stop(self) -> None:
        self._shutdown()
        self._events.close()

    def submit(self, request: Request) -> None:
        self._call(self._submit, request)

    def cancel(self, request_id: str) -> None:
        self._call(self._cancel, request_id)

    def close_session(self, session_id: str) -> None:
        self._call(self._close_session, session_id)

    def forget(self, session_id: str) -> None:
        self.close_session(session_id)  # nothing of it is saved here

    def set_policy(self, policy: str | Policy) -> None:
        self._events.put([CommandRejected(f"policy not changed: a remote engine schedules on its servers "
                                          f"({', '.join(self.config.urls)}); policies apply to the local engine")])

    def set_spec(self, mode: str | SpecMode) -> None:
        self._events.put([CommandRejected(f"speculation not changed: a remote engine decodes on its servers "
                                          f"({', '.join(self.config.urls)}); --spec applies to the local engine")])

    def restore_session(self, session_id: str, messages: tuple[Message, ...]) -> None:
        self._events.put([SessionRestored(session_id, RestoreOutcome.UNSUPPORTED,
                                          detail="a remote engine keeps no saved KV here; its servers "
                                          "manage their own prompt caches")])

    def poll_events(self, timeout: float | None = 0.0) -> list[EngineEvent] | None:
        return self._events.poll(timeout)

    # ---- the loop thread ---------------------------------------------------------------------

    def _call(self, fn, *args) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            self._fail_request(args[0], "the remote engine is not running; restart it (ctrl+r)")
            return
        loop.call_soon_threadsafe(fn, *args)

    def _fail_request(self, arg, why: str) -> None:
        if isinstance(arg, Request):
            self._events.put([SeqUpdate(arg.request_id, arg.session_id, None, Phase.DONE,
                                        done_reason=DoneReason.ERROR, error=why)])

    def _run(self, started: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        started.set()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        cfg = self.config
        timeout = httpx.Timeout(cfg.read_timeout_s, connect=cfg.connect_timeout_s)
        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        # Idle connections are let go before llama-server's 5 s keep-alive closes them: a request
        # sent on one just as the server closes it fails before any answer (request.py retries it once).
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
        async with httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits) as http:
            self._http = http
            # Connecting runs beside the wait for stop(): quitting while a server is slow to
            # answer does not wait out its timeout.
            background = [asyncio.create_task(self._flush_loop()), asyncio.create_task(self._connect_and_watch())]
            await self._stop.wait()
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self._fail_early("the remote engine stopped before it connected")
            self._flush()

    def _shutdown(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(lambda: self._stop.set())
            thread.join(timeout=10)
        self._loop = self._thread = None

    async def _connect(self) -> bool:
        """Ask every server what it serves (/v1/models); ready if any answers."""
        endpoints = self.pool.endpoints
        for i, endpoint in enumerate(endpoints):
            self._emit(LoadProgress(i / len(endpoints), self.model or "remote model", endpoint.url,
                                    stage=f"connecting to {endpoint.url}"))
            await self._probe(endpoint)
        healthy = [e for e in endpoints if e.healthy]
        if not healthy:
            why = "; ".join(f"{e.url}: {e.last_error}" for e in endpoints)
            self._failed = True
            self._fail_early(f"no server answered ({why})")
            self._emit(EngineFailed(f"no server answered ({why}). Start one, then restart (ctrl+r)",
                                    restartable=True))
            return False
        if self.model is None:
            listed = next((e.models for e in healthy if e.models), [])
            if not listed:
                self._failed = True
                self._fail_early("no model named")
                self._emit(EngineFailed("the servers list no model; name one with --remote-model", restartable=False))
                return False
            self.model = listed[0]
        self._ready = True
        self._emit(LoadProgress(1.0, self.model, ", ".join(e.url for e in healthy), stage="connected"))
        self._emit(EngineReady(model=self.model, device=f"remote: {len(healthy)} of {len(endpoints)} servers",
                               n_ctx=0, n_seq_max=sum(e.limit for e in healthy), n_batch=0, policy="server",
                               info=EngineInfo()))
        self._status_dirty = True
        unlisted = unlisted_model(self.config.model, healthy)
        if unlisted is not None:
            # In a batch of its own after EngineReady: whoever waits for ready (generate) reads that
            # batch no further. The app shows it as a warning; the engine goes on.
            self._flush()
            self._emit(CommandRejected(unlisted))
        early, self._early = self._early, []
        for request in early:
            self._start(request)
        return True

    async def _connect_and_watch(self) -> None:
        if await self._connect():
            await self._probe_loop()

    async def _probe(self, endpoint) -> None:
        assert self._http is not None  # _main opened it before connecting
        try:
            response = await self._http.get(base_url(endpoint.url) + "/models",
                                            timeout=self.config.connect_timeout_s)
        except httpx.HTTPError as exc:
            endpoint.healthy, endpoint.last_error = False, f"not reachable ({type(exc).__name__})"
            return
        if response.status_code in (401, 403):
            endpoint.healthy = False
            endpoint.last_error = f"refused the API key ({response.status_code}); see --api-key-env"
            return
        if response.status_code == 429 or response.status_code >= 500:
            # Up but not serving yet: llama-server answers every path 503 "Loading model" while it
            # loads, vLLM a 5xx while starting. It takes no work until a probe gets an answer.
            endpoint.healthy = False
            endpoint.last_error = f"not ready: answered {response.status_code} ({error_message(response.text)})"
            return
        endpoint.healthy = True
        try:
            endpoint.models = [m["id"] for m in response.json().get("data", [])]
        except (ValueError, AttributeError, KeyError, TypeError):
            endpoint.models = []

    async def _probe_loop(self) -> None:
        """A server marked dead is asked again every probe interval; if it answers, it takes work."""
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            for endpoint in self.pool.endpoints:
                if not endpoint.healthy:
                    await self._probe(endpoint)
                    self._status_dirty = True

    # ---- requests (loop thread) --------------------------------------------------------------

    def _submit(self, request: Request) -> None:
        rid = request.request_id
        if rid in self._seqs:
            self._emit(SeqUpdate(rid, request.session_id, None, Phase.DONE, done_reason=DoneReason.ERROR,
                                 error=f"request id {rid!r} is already running; use a new id"))
            return
        seq = RemoteSeq(request)
        self._seqs[rid] = seq
        if self._failed:
            seq.finish(DoneReason.ERROR, "the remote engine is not connected; restart it (ctrl+r)")
            self._changed[rid] = seq
        elif not self._ready:
            seq.phase = Phase.LOADING
            self._early.append(request)
            self._changed[rid] = seq
        else:
            self._start(request)

    def _start(self, request: Request) -> None:
        seq = self._seqs[request.request_id]
        seq.phase = Phase.QUEUED
        self._changed[request.request_id] = seq
        self._tasks[request.request_id] = asyncio.get_running_loop().create_task(self._run_one(seq))

    async def _run_one(self, seq: RemoteSeq) -> None:
        rid = seq.request.request_id
        try:
            assert self._http is not None and self.model is not None  # requests start once connected
            await run_request(seq, pool=self.pool, http=self._http, config=self.config, model=self.model,
                              changed=self._mark, prefer=self._home.get(seq.request.session_id))
            if seq.endpoint is not None:
                self._home[seq.request.session_id] = seq.endpoint
        except asyncio.CancelledError:
            seq.finish(DoneReason.CANCELLED)
        except RequestFailed as exc:
            seq.finish(DoneReason.ERROR, str(exc), exc.kind)
        except Exception as exc:  # a bug here must fail this request only, with the reason
            seq.finish(DoneReason.ERROR, f"the remote client failed: {type(exc).__name__}: {exc}")
        finally:
            self._tasks.pop(rid, None)
            self._mark(seq)

    def _mark(self, seq: RemoteSeq) -> None:
        self._changed[seq.request.request_id] = seq
        self._status_dirty = True

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()  # closing the stream frees the server's slot
            return
        seq = self._seqs.get(request_id)
        if seq is not None and seq.phase is Phase.LOADING:
            self._early = [r for r in self._early if r.request_id != request_id]
            seq.finish(DoneReason.CANCELLED)
            self._changed[request_id] = seq

    def _close_session(self, session_id: str) -> None:
        # The server keeps no per-conversation state the client could free; end its requests.
        self._home.pop(session_id, None)
        for rid, seq in list(self._seqs.items()):
            if seq.request.session_id == session_id:
                self._cancel(rid)

    def _fail_early(self, why: str) -> None:
        early, self._early = self._early, []
        for request in early:
            seq = self._seqs[request.request_id]
            seq.finish(DoneReason.ERROR, why)
            self._changed[request.request_id] = seq

    # ---- batches -----------------------------------------------------------------------------

    def _emit(self, event: EngineEvent) -> None:
        self._pending.append(event)

    async def _flush_loop(self) -> None:
        since_status = 0.0
        while True:
            await asyncio.sleep(FLUSH_S)
            since_status += FLUSH_S
            # While anything streams the rates move even when nothing else changed.
            if (self._status_dirty or self._tasks) and since_status >= STATUS_S and self._ready:
                since_status, self._status_dirty = 0.0, False
                self._emit(EndpointsReport(self.pool.statuses()))
            self._flush()

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        changed, self._changed = self._changed, {}
        for rid, seq in changed.items():
            if self._seqs.get(rid) is not seq:
                continue  # its done update is out already (a request ended by _broken)
            try:
                batch.append(seq.update())
            except Exception as exc:  # a bug here fails this request only, never the flush loop
                batch.append(self._broken(seq, exc))
            if seq.phase is Phase.DONE:
                self._seqs.pop(rid, None)
        if self._failed and any(isinstance(e, EngineFailed) for e in batch):
            # The failure comes after the requests it ended.
            batch.sort(key=lambda e: isinstance(e, EngineFailed))
        if batch:
            self._events.put(batch)

    def _broken(self, seq: RemoteSeq, exc: Exception) -> SeqUpdate:
        """The done update of a request whose own update could not be built: its task is ended
        (its stream closed) and the pane says why. Every other request goes on."""
        rid = seq.request.request_id
        why = f"the remote client failed: {type(exc).__name__}: {exc}"
        task = self._tasks.pop(rid, None)
        if task is not None:
            task.cancel()
        seq.finish(DoneReason.ERROR, why)
        seq.phase = Phase.DONE
        return SeqUpdate(rid, seq.request.session_id, None, Phase.DONE, done_reason=DoneReason.ERROR, error=why,
                         remote=RemoteFacts(seq.endpoint, False, None))
