"""The attention probe weighs a pool of other conversations resident, as agents keep them: the dense
path multiplies every row by every resident cell, flash does not."""

from __future__ import annotations

from backend import attention
from backend.attention import PathTiming
from backend.fake import FakeBackend
from backend.protocol import KvStateError
from scheduler.types import BatchPlan

KEY = {"model": "/m.gguf", "device": "CPU", "n_threads": 1, "build": "x"}


def _timing(flash: bool, fill: float, chunk_pool: float, pool: int = 6) -> PathTiming:
    return PathTiming(flash=flash, fill_ms=fill, decode_shallow_ms=90.0, decode_deep_ms=95.0, chunk_deep_ms=160.0,
                      decode_mixed_ms=95.0, chunk_pool_ms=chunk_pool, decode_pool_ms=320.0, pool=pool)


def test_a_path_faster_shallow_but_twice_as_slow_beside_a_pool_loses():
    # This machine's probe (1 thread): dense filled 1,024 tokens in 8.9 s against flash's 12.5 and
    # won the old reference workload by 1.34x; beside six other conversations its 64-row prompt
    # chunk took 2,541 ms against flash's 1,289.
    choice = attention.decide((_timing(True, fill=12500.0, chunk_pool=1289.0),
                               _timing(False, fill=8900.0, chunk_pool=2541.0)), KEY)
    assert choice.flash
    assert "1289 vs 2541 ms for a 64-row prompt chunk beside 6 other conversations" in choice.reason
    on = choice.timings[0]
    assert on.reference_ms == (12500.0 + attention.REFERENCE_STEPS * (90.0 + 95.0 + 95.0)
                               + attention.PROBE_DEPTH / attention.POOL_CHUNK * 1289.0
                               + attention.REFERENCE_STEPS * 320.0)


def test_without_a_pool_the_reference_is_the_old_one_and_dense_may_still_win():
    choice = attention.decide((_timing(True, fill=12500.0, chunk_pool=0.0, pool=0),
                               _timing(False, fill=8900.0, chunk_pool=0.0, pool=0)), KEY)
    assert not choice.flash and "other conversations" not in choice.reason


def test_the_pool_follows_the_context_and_is_part_of_the_cache_key(tmp_path):
    assert [attention.pool_size(n) for n in (1024, 2048, 8191, 8192, 65536)] == [0, 0, 0, 6, 6]
    assert attention.probe_cells(6) == 8 * attention.PROBE_DEPTH
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    keys = [attention.cache_key(model_path=str(model), device="CPU", n_threads=1, n_ubatch=512, build="x", pool=p)
            for p in (0, 6)]
    assert keys[0] != keys[1] and keys[1]["probe"][-1] == attention.PROBE_VERSION


class _Recording(FakeBackend):
    """Records the cells resident and the rows of every step the probe runs."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.steps: list[tuple[int, int, int]] = []  # (cells before, rows, sequences)

    def decode(self, plan: BatchPlan):
        self.steps.append((self.kv_cells_used(), plan.n_rows, len(plan.slices)))
        return super().decode(plan)


def test_the_pool_steps_run_beside_loaded_copies_and_leave_nothing_behind():
    backend = _Recording(n_ctx=attention.probe_cells(6), n_seq_max=8, n_batch=attention.PROBE_CHUNK)
    t = attention.measure_path(backend, True, list(range(100, 400)), pool=6)
    depth = attention.PROBE_DEPTH
    assert t.pool == 6
    pooled = [s for s in backend.steps if s[0] >= 7 * depth]
    # three 64-row chunks of the deep conversation, then three steps of one row per conversation
    assert pooled == [(7 * depth, attention.POOL_CHUNK, 1)] * 3 + [(7 * depth, 7, 7)] * 3
    assert backend.kv_cells_used() == 0


class _Refusing(_Recording):
    def kv_load(self, seq_id: int, state: bytes) -> int:
        if seq_id == 3:
            raise KvStateError("no room")
        return super().kv_load(seq_id, state)


def test_a_backend_that_refuses_the_copies_is_weighed_without_a_pool():
    backend = _Refusing(n_ctx=attention.probe_cells(6), n_seq_max=8, n_batch=attention.PROBE_CHUNK)
    t = attention.measure_path(backend, False, list(range(100, 400)), pool=6)
    assert (t.pool, t.chunk_pool_ms, t.decode_pool_ms) == (0, 0.0, 0.0)
    assert max(cells for cells, _, _ in backend.steps) < 2 * attention.PROBE_DEPTH
    assert backend.kv_cells_used() == 0


def test_paths_are_compared_without_the_pool_when_only_one_measured_it():
    # flash refused the copies (no pool part); dense measured a slow pool. Weighed alike, dense's
    # faster fill wins as it would without a pool, not by the pool part flash never paid.
    on = _timing(True, fill=12500.0, chunk_pool=0.0, pool=0)
    off = _timing(False, fill=8900.0, chunk_pool=2541.0)
    assert attention.references(on, off) == (on.weighed(False), off.weighed(False))
    choice = attention.decide((on, off), KEY)
    assert not choice.flash and "other conversations" not in choice.reason
