"""Provides the engine worker: builds the backend, owns the Engine, and talks to the client over a pipe."""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Connection

from magnitude_tui.engine.events import (
    Cancel,
    CloseSession,
    CommandRejected,
    EngineConfig,
    EngineFailed,
    EngineReady,
    LoadProgress,
    PolicyChanged,
    SetPolicy,
    Shutdown,
    Submit,
)

# How long the loop blocks on the pipe when the engine has nothing to do. Short enough that the
# coalescing window (a few ms) is honoured without spinning.
IDLE_POLL_S = 0.002


def build_backend(config: EngineConfig, on_progress=None):
    """Build the backend the config names. Only this function knows the concrete backends."""
    if config.backend == "fake":
        from backend.fake import FakeBackend

        return FakeBackend(n_ctx=config.n_ctx, n_seq_max=config.n_seq_max, n_batch=config.n_batch)
    if config.backend.startswith("simulated"):
        from backend.simulated import make_simulated

        return make_simulated(config)
    if config.backend == "llama":
        from backend.llama_backend import LlamaBackend

        return LlamaBackend.load(
            model_path=config.model,
            device=config.device,
            n_ctx=config.n_ctx,
            n_seq_max=config.n_seq_max,
            n_batch=config.n_batch,
            n_ubatch=config.n_ubatch,
            n_threads=config.n_threads,
            flash_attn=config.flash_attn,
            verbose=config.verbose,
            on_progress=on_progress,
        )
    raise ValueError(f"unknown backend {config.backend!r} (use llama, fake or simulated:<profile>)")


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
    _redirect_native_output(log_path)
    model_name = os.path.basename(config.model) if config.model else config.backend
    if config.backend == "llama" and not config.model:
        try:
            from backend.llama_backend import default_model_path

            model_name = os.path.basename(default_model_path())
        except Exception:  # reported properly by the load below
            pass
    last_sent = [0.0]

    def on_progress(fraction: float, device: str) -> None:
        # The callback fires per tensor; throttle so the pipe carries a few dozen events at most.
        now = time.monotonic()
        if fraction >= 1.0 or now - last_sent[0] > 0.05:
            last_sent[0] = now
            conn.send([LoadProgress(fraction=fraction, model=model_name, device=device)])

    try:
        backend = build_backend(config, on_progress=on_progress)
        from magnitude_tui.engine.core import Engine

        # A simulated backend's virtual clock is picked up by the Engine itself.
        engine = Engine(backend, policy=config.policy, coalesce_ms=config.coalesce_ms,
                        prepare_notice_chars=config.prepare_notice_chars)
        conn.send([LoadProgress(fraction=1.0, model=model_name, device=getattr(backend, "device_name", backend.name),
                                stage="calibrating the step-cost model")])
        engine.calibrate()
    except Exception as exc:  # a load failure ends this worker, with the reason for the user
        conn.send([EngineFailed(message=f"engine failed to start: {exc}", restartable=False)])
        traceback.print_exc()
        return
    conn.send([EngineReady(
        model=getattr(backend, "model_name", model_name),
        device=getattr(backend, "device_name", backend.name),
        n_ctx=backend.n_ctx,
        n_seq_max=backend.n_seq_max,
        n_batch=backend.n_batch,
        policy=engine.policy,
        info=getattr(backend, "info", {}) or {},
    )])
    try:
        _loop(conn, engine)
    finally:
        backend.close()


def _loop(conn: Connection, engine) -> None:
    while True:
        timeout = 0.0 if engine.has_work() else 0.25
        while conn.poll(timeout):
            cmd = conn.recv()
            if isinstance(cmd, Shutdown):
                return
            if isinstance(cmd, Submit):
                engine.submit(cmd.request)
            elif isinstance(cmd, Cancel):
                engine.cancel(cmd.request_id)
            elif isinstance(cmd, CloseSession):
                engine.close_session(cmd.session_id)
            elif isinstance(cmd, SetPolicy):
                try:
                    engine.set_policy(cmd.policy)
                    conn.send([PolicyChanged(policy=cmd.policy)])
                except ValueError as exc:
                    conn.send([CommandRejected(message=f"policy not changed: {exc}")])
            timeout = 0.0
        report = engine.step()
        if report is not None:
            conn.send([report])
        elif engine.has_work():
            # Inside the idle coalescing window: wait for more arrivals without spinning.
            if conn.poll(IDLE_POLL_S):
                continue
