"""Provides the engine worker: builds the backend, owns the Engine, and talks to the client over a pipe."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection

from backend.factory import BackendConfig, build_backend, build_draft_source
from backend.template_fallback import INFO_NOTICE
from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.events import EngineConfig, EngineFailed, EngineInfo, EngineReady, LoadProgress, Shutdown
from magnitude_tui.engine.warm_store import WarmStore

# How long the loop blocks on the pipe when the engine has nothing to do. Short enough that the
# coalescing window (a few ms) is honoured without spinning.
IDLE_POLL_S = 0.002


def _redirect_native_output(log_path: str | None) -> None:
    """Native code writes to fds 1 and 2; in the worker they must never reach the app's terminal."""
    if not log_path:
        return
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def serve(conn: Connection, config: EngineConfig, log_path: str | None = None) -> None:
    """Worker entry point: load, then loop (drain commands, step, send one report per step)."""
    if threading.current_thread() is threading.main_thread():
        # ctrl+c in a terminal reaches the whole process group; it is the client's to act on (a
        # headless server first lets its streams finish), and the worker stops when told to (or
        # when the pipe closes). SIGTERM keeps its default: multiprocessing stops daemons with it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _redirect_native_output(log_path)
    model_name = _model_name(config.backend)
    last_sent = [0.0]

    def on_progress(fraction: float, device: str) -> None:
        # The callback fires per tensor; throttle so the pipe carries a few dozen events at most.
        now = time.monotonic()
        if fraction >= 1.0 or now - last_sent[0] > 0.05:
            last_sent[0] = now
            conn.send([LoadProgress(fraction=fraction, model=model_name, device=device)])

    draft = None
    warm_off: str | None = None
    try:
        backend = build_backend(config.backend, on_progress=on_progress)
        if config.backend.draft_model is not None:
            conn.send([LoadProgress(fraction=1.0, model=os.path.basename(config.backend.draft_model),
                                    device=backend.device_name, stage="loading the draft model")])
            draft = build_draft_source(config.backend, backend)
        warm, warm_off = _warm_store(config, backend)
        engine = Engine(backend, policy=config.policy, coalesce_ms=config.coalesce_ms,
                        prepare_notice_chars=config.prepare_notice_chars, auto_threads=config.auto_threads,
                        warm=warm, spec=config.spec, ram_bytes=config.kv_ram_mb << 20,
                        drafts={draft.kind: draft} if draft is not None else None)
        conn.send([LoadProgress(fraction=1.0, model=backend.model_name, device=backend.device_name,
                                stage="calibrating the step-cost model")])
        engine.calibrate()
    except Exception as exc:  # a load failure ends this worker, with the reason for the user
        conn.send([EngineFailed(message=f"engine failed to start: {exc}", restartable=False)])
        traceback.print_exc()
        return
    conn.send([EngineReady(
        model=backend.model_name,
        device=backend.device_name,
        n_ctx=backend.n_ctx,
        n_seq_max=backend.n_seq_max,
        n_batch=backend.n_batch,
        policy=engine.policy,
        info=EngineInfo(n_ctx_seq=backend.n_ctx_seq, attention=backend.info.get("attention"),
                        template_notice=backend.info.get(INFO_NOTICE),
                        draft_model=draft.model_name if draft is not None else None, warm_resume=warm_off),
        spec=engine.spec,
    )])
    try:
        _loop(conn, engine)
    finally:
        if draft is not None:
            draft.close()
        backend.close()


def _warm_store(config: EngineConfig, backend) -> tuple[WarmStore | None, str | None]:
    """Where this engine saves idle conversations' KV (None when the config turns it off), and
    why it is off when the config asked for it."""
    if not config.warm_dir or config.warm_budget_mb <= 0:
        return None, None
    try:
        return WarmStore(config.warm_dir, layout=backend.state_layout,
                         budget_bytes=config.warm_budget_mb << 20), None
    except OSError as exc:
        # A read-only data directory: warm resume is an optimisation, never a reason not to start.
        print(f"warm resume is off: cannot use {config.warm_dir}: {exc}", file=sys.stderr, flush=True)
        return None, f"off: cannot use {config.warm_dir} ({exc.strerror or exc})"


def _model_name(config: BackendConfig) -> str:
    """What the loading view names before the backend exists (the file, or the stand-in's kind)."""
    if config.model:
        return os.path.basename(config.model)
    if config.family != "llama":
        return config.kind
    try:
        from backend.llama_load import default_model_path

        return os.path.basename(default_model_path())
    except Exception:  # reported properly by the load that follows
        return "the default model"


def _loop(conn: Connection, engine: Engine) -> None:
    while True:
        timeout = 0.0 if engine.has_work() else 0.25
        while conn.poll(timeout):
            command = conn.recv()
            answer = engine.apply(command)  # a malformed command is answered, and the loop goes on
            if answer is not None:
                conn.send([answer])
            if isinstance(command, Shutdown):
                return
            timeout = 0.0
        report = engine.step()
        notices = engine.take_notices()
        if report is not None or notices:
            conn.send([*notices, *([report] if report is not None else [])])
        elif engine.has_work():
            # Inside the idle coalescing window: wait for more arrivals without spinning.
            if conn.poll(IDLE_POLL_S):
                continue
