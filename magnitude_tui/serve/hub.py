"""Provides EngineHub: routes the engine's per-step event batches to the HTTP requests waiting on them."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import replace
from enum import Enum
from typing import Any, Callable

from magnitude_tui.engine.events import CommandRejected, EngineFailed, EngineReady, LoadProgress, SeqUpdate, StepReport
from magnitude_tui.names import first_free, numbered
from scheduler.types import DoneReason, ErrorKind, Phase, Request

# What HTTP callers (and the unauthenticated /health) are told when the worker dies: the full
# reason (pid, signal, log path) is for whoever runs the server and goes to its log only.
WORKER_DIED = "the engine stopped while running this request"


class EngineState(str, Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class EngineHub:
    """One per server. Whoever reads the engine's event stream (the headless server's own task, or
    the TUI's workspace when both share one engine) hands every batch to `dispatch`; each request's
    updates land on the queue it was submitted with, stamped with the time they arrived."""

    def __init__(self, client, *, clock: Callable[[], float] = time.monotonic, callers_see_errors: bool = False) -> None:
        self.client = client
        self.clock = clock
        # A request ended on its own (not in a step report) keeps its error text only for callers
        # who run the engine themselves (the headless `run`: a remote server's refusal, a dead
        # worker's signal and log); HTTP callers are told WORKER_DIED.
        self.callers_see_errors = callers_see_errors
        # Told what the engine says that is nobody's request (a remote model name no server
        # lists); None: nobody listens.
        self.on_notice: Callable[[str], None] | None = None
        self.state = EngineState.LOADING
        self.load_fraction = 0.0
        self.failure: str | None = None  # the engine's own words, for the operator's log
        self.failed: EngineFailed | None = None
        self.draining = False  # the server is shutting down: no new calls
        self.num_ready = 0  # EngineReady events seen: a worker that loaded, restarts included
        self.supervised = False  # a dead worker is restarted by the server (headless serve)
        # Set whenever `state` changes (the headless server's supervisor waits on it).
        self.state_changed = asyncio.Event()
        self.ready: EngineReady | None = None
        self.last_report: StepReport | None = None
        self._routes: dict[str, tuple[asyncio.Queue, int]] = {}
        self._last: dict[str, SeqUpdate] = {}  # each live request's latest update (its counts)
        self._live_sessions: dict[str, str] = {}  # session -> its live request id
        self._run = uuid.uuid4().hex[:6]  # session ids stay unique across runs (they name panes)
        # Called for every conversation's request sent, with the caller's name (the TUI opens a
        # pane for it); not for an n > 1 call's prompt evaluation, which is nobody's conversation.
        self.on_request: Callable[[Request, str], None] | None = None

    # ---- engine -> requests ----------------------------------------------------------------

    async def run(self, wait_s: float = 0.2) -> None:
        """Read the client's event stream until cancelled (the headless server): a blocking wait
        on a thread, then whatever else is already queued without one."""
        loop = asyncio.get_running_loop()
        while True:
            batch = await loop.run_in_executor(None, self.client.poll_events, wait_s)
            while batch is not None:
                self.dispatch(batch)
                batch = self.client.poll_events(0)

    def dispatch(self, batch: list) -> None:
        now = self.clock()
        for ev in batch:
            if isinstance(ev, StepReport):
                self.last_report = ev
                for u in ev.updates:
                    self._route(u, now)
            elif isinstance(ev, SeqUpdate):  # outside a step: a dead worker's, a remote request's
                hide = ev.error and not self.callers_see_errors
                self._route(replace(ev, error=WORKER_DIED) if hide else ev, now)
            elif isinstance(ev, LoadProgress):
                self.load_fraction = ev.fraction
                self._set_state(EngineState.LOADING)
            elif isinstance(ev, EngineReady):
                self.ready, self.failure, self.failed = ev, None, None
                self.num_ready += 1
                self._set_state(EngineState.READY)
            elif isinstance(ev, EngineFailed):
                self.failure, self.failed = ev.message, ev
                self._set_state(EngineState.FAILED)
            elif isinstance(ev, CommandRejected) and self.on_notice is not None:
                self.on_notice(ev.message)

    def _set_state(self, state: EngineState) -> None:
        if state is not self.state:
            self.state = state
            self.state_changed.set()

    def _route(self, u: SeqUpdate, now: float) -> None:
        route = self._routes.get(u.request_id)
        if route is None:
            return
        queue, tag = route
        self._last[u.request_id] = u
        if u.phase is Phase.DONE:
            del self._routes[u.request_id]
            del self._last[u.request_id]
            if self._live_sessions.get(u.session_id) == u.request_id:
                del self._live_sessions[u.session_id]
        queue.put_nowait((tag, u, now))

    # ---- requests -> engine ----------------------------------------------------------------

    def session_for(self, client_name: str) -> str:
        """The conversation a caller's next request runs in: one per caller while it has one
        request at a time (its KV stays resident between calls), a fresh one beside it when
        it sends several at once."""
        # ASCII letters, digits, '-' and '_' only: under --serve the session id names the caller's
        # pane, and a widget id with '@' or '.' (a caller's address) is refused by the TUI.
        slug = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else "_"
                       for ch in client_name)[:40] or "anon"
        if slug != client_name:
            # Characters were replaced or cut: callers whose names differ only there ("a.b" and
            # "a_b", or any two non-ASCII names of one length) must not share a conversation, nor
            # under --serve a pane, so the full name's digest goes with it.
            slug += "-" + hashlib.blake2s(client_name.encode(), digest_size=4).hexdigest()
        return first_free(self._live_sessions, numbered(f"http-{self._run}-{slug}", "-"))

    def hold(self, session_id: str, request_id: str) -> None:
        """Keep a session taken for a request that runs in it later (an n > 1 call's first choice,
        while its prompt is evaluated), so `session_for` hands calls arriving meanwhile another."""
        self._live_sessions.setdefault(session_id, request_id)

    def let_go(self, session_id: str, request_id: str) -> None:
        """Give back a session `hold` kept for `request_id`, if it still does."""
        if self._live_sessions.get(session_id) == request_id:
            del self._live_sessions[session_id]

    def submit(self, request: Request, queue: asyncio.Queue, tag: int = 0, client_name: str | None = None) -> None:
        """Send a request; its updates arrive on `queue` as (tag, SeqUpdate, arrival time).
        `client_name` None: not a conversation of its own (no pane under --serve)."""
        self._routes[request.request_id] = (queue, tag)
        self._live_sessions[request.session_id] = request.request_id
        try:
            if self.on_request is not None and client_name is not None:
                self.on_request(request, client_name)
            self.client.submit(request)
        except BaseException:
            # Never sent: it must not count as in flight (enough such leaks would answer 429 forever).
            self._routes.pop(request.request_id, None)
            self._live_sessions.pop(request.session_id, None)
            raise

    def cancel(self, request_id: str) -> None:
        if request_id in self._routes:
            self.client.cancel(request_id)

    def end_all(self, message: str) -> int:
        """End every live request now with `message` as its error (the server is stopping): each
        waiting call gets its last word at once, and the engine is told to cancel them. Returns
        how many were ended."""
        sessions = {rid: sid for sid, rid in self._live_sessions.items()}
        live = list(self._routes)
        now = self.clock()
        for rid in live:
            self.client.cancel(rid)
            # The latest counts stay (usage, the log line): only the ending is new.
            last = self._last.get(rid)
            counts: dict[str, Any] = {} if last is None else dict(
                prompt_done=last.prompt_done, prompt_total=last.prompt_total, cached_tokens=last.cached_tokens,
                generated=last.generated, queue_ms=last.queue_ms, ttft_ms=last.ttft_ms,
                itl_p50_ms=last.itl_p50_ms, itl_p95_ms=last.itl_p95_ms, priority=last.priority)
            self._route(SeqUpdate(request_id=rid, session_id=sessions.get(rid, ""), seq_id=None,
                                  phase=Phase.DONE, done_reason=DoneReason.ERROR, error=message,
                                  error_kind=ErrorKind.FAILED, **counts), now)
        return len(live)

    @property
    def num_live(self) -> int:
        return len(self._routes)

    @property
    def context_per_sequence(self) -> int:
        """Tokens one sequence may hold (prompt plus reply), once the engine is ready."""
        if self.ready is None:
            return 4096
        return self.ready.info.n_ctx_seq or self.ready.n_ctx
