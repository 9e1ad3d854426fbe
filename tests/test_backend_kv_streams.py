"""The llama.cpp backend with a KV cache stream per sequence (serve --kv-streams), on the real model:
each sequence's room, forks copied between streams at once, and the engine over them."""

from __future__ import annotations

import numpy as np
import pytest

from backend.factory import reset_kv
from backend.protocol import DecodeOutcome, PlanError
from scheduler.types import BatchPlan, SeqSlice
from tests.greedy import greedy
from tests.needs import need_real_model

pytestmark = pytest.mark.slow

TEXT = "The keeper climbed the stairs of the lighthouse every evening and lit the lamp for the ships."
OTHER = "Rivers run down from the mountains to the sea, carrying stones, sand and the light of stars."


@pytest.fixture(scope="module")
def streams():
    need_real_model()
    from backend.llama_backend import LlamaBackend

    backend = LlamaBackend.load(device="cpu", n_ctx=1024, n_seq_max=4, n_batch=512, n_ubatch=512, kv_streams=True)
    yield backend
    backend.close()


@pytest.fixture
def clean(streams):
    reset_kv(streams)  # no sequence or sampler left by the test before
    return streams


def _ok(b, step: int, *slices: SeqSlice):
    r = b.decode(BatchPlan(step, tuple(slices), 0))
    assert r.outcome is DecodeOutcome.OK, r
    return r


def test_each_sequence_holds_its_share_of_the_context(clean):
    b = clean
    assert b.n_ctx == 1024 and b.n_ctx_seq == 256 and not b.kv_shared_pool
    assert "256 cells each" in b.info["kv_layout"] and b.state_layout.endswith("|kv=streams:4")
    with pytest.raises(PlanError, match="exceed the context"):
        b.check_plan(BatchPlan(0, (SeqSlice(0, 0, tuple(range(100, 400)), True, False),), 0))
    _ok(b, 0, SeqSlice(0, 0, tuple(range(100, 356)), True, False))  # the whole share fits


def test_a_fork_continues_from_its_parents_cells(clean):
    b = clean
    toks = tuple(b.tokenize(TEXT))
    parent = np.array(b.logits(_ok(b, 0, SeqSlice(0, 0, toks, True, False)).logit_rows[0]))
    b.kv_copy(0, 2, 10)
    assert b.kv_pos_max(2) == 9
    # The copy is made at once: the fork's state can be saved before any step, and another state
    # loaded into the parent's stream leaves the fork's copy as it was.
    assert len(b.kv_save(2)) < len(b.kv_save(0))  # ten positions of the parent's
    other = tuple(b.tokenize(OTHER))
    _ok(b, 1, SeqSlice(1, 0, other[:12], False, False))
    b.kv_remove(0)
    assert b.kv_load(0, b.kv_save(1)) == 12
    fork = np.array(b.logits(_ok(b, 2, SeqSlice(2, 10, toks[10:], True, False)).logit_rows[2]))
    assert np.allclose(fork, parent, atol=1e-3)  # the parent's first ten rows, then the same text
    # A fork of another text's first ten tokens reads those: its logits part from the parent's.
    b.kv_copy(1, 3, 10)
    stranger = np.array(b.logits(_ok(b, 3, SeqSlice(3, 10, toks[10:], True, False)).logit_rows[3]))
    assert np.abs(stranger - parent).max() > 1.0


def test_batched_greedy_equals_solo_greedy_across_streams(clean):
    """Each row attends to its own stream: sequences decoded together (in any seq order) choose
    the tokens each chooses alone, up to a near-tie (see test_backend_llama's batched test)."""
    b = clean
    prompts = {3: b.tokenize(TEXT), 0: b.tokenize(OTHER), 2: b.tokenize(TEXT[:40] + OTHER[40:])}
    margins: dict = {}
    together = greedy(b, prompts, 12)
    for s, p in prompts.items():
        for q in range(b.n_seq_max):
            b.kv_remove(q)
        alone = greedy(b, {s: p}, 12, margins)
        first = next((i for i, (x, y) in enumerate(zip(alone[s], together[s])) if x != y), None)
        if first is not None:
            assert margins[s][first] < 0.5, (s, first, margins[s][first])
        margins.clear()


def test_the_engine_serves_turns_and_forks_across_streams_as_cold_runs(clean):
    """Through the scheduler: two conversations reply side by side; a fork of one continues from
    its copied cells (all but its new token cached) and replies as the same prompt run cold; the
    ledger and the native cache agree throughout, and a closed conversation leaves nothing."""
    from magnitude_tui.engine.core import Engine
    from tests.engine_driver import Driver, close_and_assert_empty

    b = clean
    engine = Engine(b, policy="fixed:64", coalesce_ms=0.0)
    d = Driver(engine)

    def run(rid, session, tokens, fork_from=None) -> str:
        d.submit(rid, session, prompt_tokens=tokens, max_tokens=12, fork_from=fork_from)
        d.run_until_done(rid)
        assert d.seen[rid].last.error is None, d.seen[rid].last.error
        return d.seen[rid].text

    d.submit("a1", "a", prompt_tokens=b.tokenize(TEXT), max_tokens=30)
    d.submit("b1", "b", prompt_tokens=b.tokenize(OTHER), max_tokens=30)
    d.run_until_done("a1", "b1")
    fork = engine.scheduler.sessions["a"].committed_tokens() + b.tokenize(" Then")
    got = run("f1", "child", fork, fork_from="a")
    assert d.seen["f1"].last.cached_tokens >= len(fork) - 2
    assert engine.scheduler.kv.mismatches() == []
    close_and_assert_empty(engine, "a", "b", "child")
    assert run("cold", "cold", fork) == got
    close_and_assert_empty(engine, "cold")
