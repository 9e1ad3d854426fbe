"""Provides WorkerClient: the EngineClient of a local engine, which runs in a worker (a spawned
process, or a thread in tests)."""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from magnitude_tui.engine import worker
from magnitude_tui.engine.events import (
    Cancel,
    CloseSession,
    Command,
    CommandRejected,
    EngineConfig,
    EngineFailed,
    EngineReady,
    ForgetSession,
    LoadProgress,
    Rejection,
    RejectReason,
    RestoreSession,
    SeqUpdate,
    SetPolicy,
    SetSpec,
    Shutdown,
    StepReport,
    Submit,
)
from magnitude_tui.engine.protocol import EngineEvent, EngineTarget, EventStream
from magnitude_tui.engine.warm_store import discard_saved
from scheduler.budget import Policy, as_policy
from scheduler.speculation import SpecMode, parse_spec_mode
from scheduler.types import DoneReason, Message, Phase, Request

# How long a worker told to shut down may take before it is killed: it first saves the
# conversations whose latest reply is not on disk yet (warm resume; a few seconds at most).
SHUTDOWN_WAIT_S = 10.0


def default_log_path() -> str:
    import platformdirs

    return str(platformdirs.user_log_path("magnitude-tui") / "engine.log")


class WorkerClient:
    """Sends commands to the engine worker and delivers its event batches (one per step).

    In process mode the engine lives in a spawned worker process: a native abort there cannot take
    the app down, and rendering never competes with the step loop for the GIL. If the worker dies,
    every live request is failed with the reason and EngineFailed follows; restart() starts anew.
    """

    def __init__(self, config: EngineConfig, *, in_process: bool = False, log_path: str | None = "auto"):
        """`log_path`: where the worker's native output (fds 1 and 2) goes: "auto" is a file in
        the user log dir, None leaves it on the terminal (CLI with --verbose)."""
        self.config = config
        self.in_process = in_process
        self.log_path = default_log_path() if log_path == "auto" else log_path
        self._events = EventStream()
        self._live: dict[str, str] = {}  # request_id -> session_id, until its done update arrives
        self._live_lock = threading.Lock()
        # Submitted before EngineReady: they wait in the pipe while the model loads, and are
        # reported `loading` with the load's progress until the engine takes them.
        self._loading: set[str] = set()
        self._load_fraction = 0.0
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        self._thread: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._ready = False  # EngineReady came from the current worker
        # The current worker's own EngineFailed (a load failure): its exit that follows is no news.
        self._worker_failure: EngineFailed | None = None
        if not in_process:
            # multiprocessing's resource tracker starts on the first spawn and passes
            # sys.stderr's fd to it; inside a Textual app stderr is a capture object with no
            # usable fd, so start the tracker now, while the real stderr is still in place.
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def target(self) -> EngineTarget:
        b = self.config.backend
        return EngineTarget(model=b.model or "", where=b.device if b.family == "llama" else b.kind)

    def start(self) -> None:
        self._stopping = False
        self._worker_failure = None
        with self._live_lock:
            self._ready = False
            self._loading = set()
            self._load_fraction = 0.0
        if self.in_process:
            ours, theirs = mp.Pipe(duplex=True)
            self._thread = threading.Thread(
                target=worker.serve, args=(theirs, self.config, None), name="engine", daemon=True
            )
            self._thread.start()
        else:
            ctx = mp.get_context("spawn")
            ours, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=worker.serve, args=(theirs, self.config, self.log_path), name="magnitude-engine", daemon=True
            )
            proc.start()
            self._proc = proc
            theirs.close()  # so that our recv() sees EOF when the worker dies
        self._conn = ours
        self._reader = threading.Thread(target=self._read, name="engine-reader", daemon=True)
        self._reader.start()

    def restart(self) -> None:
        """Start a new worker (after a death or to apply a new config); poll_events() keeps flowing."""
        self._shutdown_worker()
        self.start()

    def stop(self) -> None:
        """Shut the worker down; poll_events() then returns None."""
        self._shutdown_worker()
        self._events.close()

    def _shutdown_worker(self) -> None:
        self._stopping = True
        if self._conn is not None:
            try:
                self._conn.send(Shutdown())
            except (OSError, EOFError, BrokenPipeError):
                pass
        if self._proc is not None:
            self._proc.join(timeout=SHUTDOWN_WAIT_S)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout=5)
        if self._thread is not None:
            self._thread.join(timeout=SHUTDOWN_WAIT_S)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._conn = self._proc = self._thread = self._reader = None

    @property
    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.is_alive()
        return self._thread is not None and self._thread.is_alive()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    # ---- commands ----------------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        rid, sid = getattr(request, "request_id", None), getattr(request, "session_id", None)
        if isinstance(rid, str) and isinstance(sid, str):
            with self._live_lock:
                # A reused id must not take over the live entry: the engine rejects the newcomer,
                # and the original still needs its error if the worker dies.
                if rid not in self._live:
                    self._live[rid] = sid
                    if not self._ready:
                        self._loading.add(rid)
                        self._events.put([self._loading_update(rid)])
        if not self._send(Submit(request)):
            self._fail_live("the engine is not running; restart it")

    def cancel(self, request_id: str) -> None:
        self._send(Cancel(request_id))

    def close_session(self, session_id: str) -> None:
        self._send(CloseSession(session_id))

    def forget(self, session_id: str) -> None:
        """The conversation was deleted: the engine ends it and deletes its saved KV. With no
        engine running to ask, the files are deleted here (the tokens in them are its text)."""
        if not self._send(ForgetSession(session_id)) and self.config.warm_dir:
            discard_saved(self.config.warm_dir, session_id)

    def set_policy(self, policy: str | Policy) -> None:
        """Parsed here, once; a malformed one is answered by CommandRejected in the stream."""
        try:
            parsed = as_policy(policy)
        except ValueError as exc:
            self._events.put([CommandRejected(message=f"policy not changed: {exc}")])
            return
        self._send(SetPolicy(parsed))

    def set_spec(self, mode: str | SpecMode) -> None:
        """Parsed here, once; an unknown mode is answered by CommandRejected in the stream (one
        whose draft source is not loaded, by the engine)."""
        try:
            parsed = parse_spec_mode(mode)
        except ValueError as exc:
            self._events.put([CommandRejected(message=f"speculation not changed: {exc}")])
            return
        self._send(SetSpec(parsed))

    def restore_session(self, session_id: str, messages: tuple[Message, ...]) -> None:
        self._send(RestoreSession(session_id, tuple(messages)))

    def _send(self, command: Command) -> bool:
        if self._conn is None:  # not started
            return False
        try:
            self._conn.send(command)
            return True
        except (OSError, EOFError, BrokenPipeError, AttributeError):
            return False

    # ---- events ------------------------------------------------------------------------------

    def poll_events(self, timeout: float | None = 0.0) -> list[EngineEvent] | None:
        """One batch, or None when none arrived within timeout (sync callers: CLI, benchmarks)."""
        return self._events.poll(timeout)

    def _read(self) -> None:
        conn = self._conn
        assert conn is not None  # start() sets it before this reader runs
        while True:
            try:
                batch = conn.recv()
            except (EOFError, OSError):
                break
            extra: list = []
            for event in batch:
                if isinstance(event, StepReport):
                    self._forget_finished(event.updates)
                    self._forget_rejected(event.rejected)
                elif isinstance(event, LoadProgress):
                    extra.extend(self._load_progress(event.fraction))
                elif isinstance(event, EngineReady):
                    with self._live_lock:
                        self._ready, self._loading = True, set()
                elif isinstance(event, EngineFailed):
                    self._worker_failure = event
            self._events.put(batch + extra)
        if self._stopping:
            return
        if self._worker_failure is not None:
            # The worker said why it stopped (llama.cpp refused the model); its exit status (0)
            # would only hide that reason.
            self._fail_live(self._worker_failure.message, announce=False)
        else:
            self._fail_live(self._death_reason())

    def _load_progress(self, fraction: float) -> list[SeqUpdate]:
        with self._live_lock:
            self._load_fraction = fraction
            return [self._loading_update(rid) for rid in sorted(self._loading)]

    def _loading_update(self, request_id: str) -> SeqUpdate:
        return SeqUpdate(request_id=request_id, session_id=self._live[request_id], seq_id=None,
                         phase=Phase.LOADING, load_fraction=self._load_fraction)

    def _forget_finished(self, updates: list[SeqUpdate]) -> None:
        with self._live_lock:
            for u in updates:
                if u.phase is Phase.DONE:
                    self._live.pop(u.request_id, None)

    def _forget_rejected(self, rejected: list[Rejection]) -> None:
        with self._live_lock:
            for r in rejected:
                # A duplicate's id belongs to the live original, which stays in the table.
                if r.reason is not RejectReason.DUPLICATE_ID:
                    self._live.pop(r.request_id, None)
                    self._loading.discard(r.request_id)

    def _death_reason(self) -> str:
        if self._proc is None:
            return "the engine thread stopped"
        # The pipe is closed: the worker is gone or going. A loaded machine may take a while to
        # reap it, and without its exit code the user would not learn why it died.
        self._proc.join(timeout=15)
        code = self._proc.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"was killed by {name}"
        elif code is None:
            how = "stopped answering"
        else:
            how = f"exited with code {code}"
        where = f"; native log: {self.log_path}" if self.log_path else ""
        return f"the engine worker {how}{where}. Restart the engine to continue."

    def _fail_live(self, reason: str, *, announce: bool = True) -> None:
        with self._live_lock:
            live, self._live, self._loading = self._live, {}, set()
        batch: list = [
            SeqUpdate(request_id=rid, session_id=sid, seq_id=None, phase=Phase.DONE,
                      done_reason=DoneReason.ERROR, error=reason)
            for rid, sid in live.items()
        ]
        if announce:
            batch.append(EngineFailed(message=reason, restartable=True))
        if batch:
            self._events.put(batch)
