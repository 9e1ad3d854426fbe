"""Shared fixtures: the real model backend is loaded once per test session (CPU)."""

from __future__ import annotations

import pytest

from tests.needs import need_real_model


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
