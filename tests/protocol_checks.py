"""The seams' implementations held to their protocols by the type checker, not at run time.

mypy reads this module (tests/test_typecheck.py): each function returns an implementation where
its protocol is expected, so a client or backend that loses a method, or changes a signature,
fails `make test` with the member named. Nothing here is called.
"""

from __future__ import annotations

from backend.fake import FakeBackend
from backend.llama_backend import LlamaBackend
from backend.protocol import Backend
from backend.simulated import SimulatedBackend
from magnitude_bench.ui_cpu import PacedClient
from magnitude_bench.ui_endurance import FloodClient
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.remote.client import RemoteClient

# ---- engine clients: what the app, the workspace, `generate` and the benchmarks talk to --------


def worker_client(client: WorkerClient) -> EngineClient:
    return client


def remote_client(client: RemoteClient) -> EngineClient:
    return client


def paced_client(client: PacedClient) -> EngineClient:
    return client


def flood_client(client: FloodClient) -> EngineClient:
    return client


# ---- backends: what the engine, the worker and the benchmarks step ----------------------------


def llama_backend(backend: LlamaBackend) -> Backend:
    return backend


def fake_backend(backend: FakeBackend) -> Backend:
    return backend


def simulated_backend(backend: SimulatedBackend) -> Backend:
    return backend
