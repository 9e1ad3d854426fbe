"""The engine in its own process: real model streaming, worker death reported to every request, restart."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.factory import BackendConfig
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig, LoadProgress, StepReport
from magnitude_tui.engine.protocol import seq_updates
from magnitude_tui.engine.waiting import wait_ready as ready_event
from magnitude_tui.reliability.crash import kill_worker
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


updates_of = seq_updates


def wait_ready(client, timeout=120):
    """The EngineReady and the load fractions reported before it."""
    seen = []
    ready = ready_event(client, timeout, seen=seen)
    return ready, [e.fraction for e in seen if isinstance(e, LoadProgress)]


def test_killing_the_worker_fails_live_requests_clearly_and_a_new_worker_starts(tmp_path):
    log = tmp_path / "engine.log"
    client = WorkerClient(EngineConfig(BackendConfig("llama", device="cpu", n_ctx=2048, n_seq_max=4)),
                          log_path=str(log))
    client.start()
    try:
        ready, progress = wait_ready(client)
        assert progress and progress[-1] == 1.0 and ready.device == "CPU"
        for i in range(2):
            client.submit(Request(f"r{i}", f"s{i}", (Message("user", "Write a long poem about rivers."),),
                                  SamplingParams(max_tokens=500)))
        streamed = {"r0": "", "r1": ""}
        while not all(streamed.values()):
            for u in updates_of(client.poll_events(timeout=30) or []):
                streamed[u.request_id] += u.text_delta
        killed = kill_worker(client, {"r0", "r1"}, timeout_s=30)
        errors, failed = killed.ended, killed.failed
        assert failed is not None and "SIGKILL" in failed.message, failed
        assert set(errors) == {"r0", "r1"}
        for u in errors.values():
            assert u.done_reason is DoneReason.ERROR and "SIGKILL" in u.error and "Restart" in u.error
        print(f"\nerror shown to each request: {errors['r0'].error}")
        client.restart()
        wait_ready(client)
        client.submit(Request("after", "s9", (Message("user", "Say hi."),), SamplingParams(max_tokens=8)))
        done = None
        while done is None:
            for u in updates_of(client.poll_events(timeout=30) or []):
                if u.phase is Phase.DONE:
                    done = u
        assert done.error is None and done.generated > 0
    finally:
        client.stop()
    assert not client.alive


def test_generate_cli_runs_eight_sequences_in_one_context():
    r = subprocess.run(
        [sys.executable, "-m", "magnitude_tui.cli", "generate",
         "What is the capital of France? Answer in one word.", "--n", "8", "--max-tokens", "12", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(r.stdout[-2500:])
    assert "8 sequences in one context" in r.stdout
    assert r.stdout.count("Paris") >= 8
    assert "TTFT" in r.stdout


def test_generate_cli_rejects_a_missing_model_file():
    r = subprocess.run([sys.executable, "-m", "magnitude_tui.cli", "generate", "hi", "--model", "/nope.gguf"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "model file not found" in (r.stdout + r.stderr)


def test_the_config_reaches_the_engine_in_the_worker():
    # In process (the same serve() on a thread), fake backend: a message as long as the configured
    # notice threshold gets a `preparing` report of its own, with no rows run.
    client = WorkerClient(EngineConfig(BackendConfig("fake"), policy="fixed:16", prepare_notice_chars=50),
                          in_process=True)
    client.start()
    try:
        ready, _ = wait_ready(client)
        assert ready.policy == "fixed:16"
        client.submit(Request("r", "s", (Message("user", "z" * 50),), SamplingParams(max_tokens=2)))
        reports, t_end = [], time.monotonic() + 30
        while not any(u.phase is Phase.DONE for r in reports for u in r.updates) and time.monotonic() < t_end:
            reports += [ev for ev in client.poll_events(timeout=1) or [] if isinstance(ev, StepReport)]
        mine = [r for r in reports if any(u.request_id == "r" for u in r.updates)]
        assert [u.phase for u in mine[0].updates] == [Phase.PREPARING]
        assert mine[0].decode_rows == mine[0].prefill_rows == 0
        assert mine[1].updates[0].phase is Phase.PREFILL and mine[1].prefill_rows == 16
        assert mine[-1].updates[-1].phase is Phase.DONE
    finally:
        client.stop()
