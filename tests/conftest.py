"""Shared fixtures: the real model backend is loaded once per test session (CPU)."""

from __future__ import annotations

import os

import pytest

from tests.needs import need_real_model


def _pin_xdist_worker() -> None:
    """In make test's parallel pass (pytest-xdist) each worker gets cores of its own, so one
    worker's llama.cpp threads never wait on cores the other's hold (a spinning thread pool on a
    shared core runs several times slower); engines then size their threads to what they see."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cpus, i = sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw"))
    os.sched_setaffinity(0, cpus[i :: int(count)] or [cpus[i % len(cpus)]])  # more workers than cores: they share


_pin_xdist_worker()


@pytest.fixture(scope="session")
def llama():
    """The real SmolLM2 backend on CPU with room for 16 sequences."""
    need_real_model()
    from backend.llama_backend import LlamaBackend

    backend = LlamaBackend.load(device="cpu", n_ctx=4096, n_seq_max=16, n_batch=512, n_ubatch=512)
    yield backend
    backend.close()


@pytest.fixture
def clean_llama(llama):
    """The shared backend with every sequence's KV removed before and after the test."""
    for s in range(llama.n_seq_max):
        llama.kv_remove(s)
        llama.free_sampler(s)
    yield llama
    for s in range(llama.n_seq_max):
        llama.kv_remove(s)
        llama.free_sampler(s)
