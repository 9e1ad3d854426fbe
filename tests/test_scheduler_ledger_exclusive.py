"""KvLedger.exclusive_cells keeps its counts between calls: they must equal a fresh count after
any mix of grow, keep_prefix, remove, copy and load (forks share cells, and a share that drops
back to one holder makes that holder's cells exclusive again)."""

from __future__ import annotations

import random

import pytest

from scheduler.ledger import KvLedger


class CountingKv:
    """The native side reduced to how many positions each sequence holds."""

    kv_shared_pool = True

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def kv_remove(self, seq_id: int) -> None:
        self.held[seq_id] = 0

    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None:
        self.held[seq_id] = min(self.held.get(seq_id, 0), n_tokens)

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None:
        self.held[dst_seq] = min(self.held.get(src_seq, 0), n_tokens)

    def kv_pos_max(self, seq_id: int) -> int:
        return self.held.get(seq_id, 0) - 1

    def kv_load(self, seq_id: int, state: bytes) -> int:
        self.held[seq_id] = len(state)
        return len(state)


class StreamsKv(CountingKv):
    """A stream per sequence: a copy gives the destination cells of its own."""

    kv_shared_pool = False


def recount(ledger: KvLedger, seq_id: int) -> int:
    return sum(1 for c in ledger._cells[seq_id] if ledger._refs[c] == 1)


@pytest.mark.parametrize("streams", [False, True])
def test_exclusive_counts_follow_every_operation(streams):
    rng = random.Random(7)
    n_seq = 6
    kv = StreamsKv() if streams else CountingKv()
    ledger = KvLedger(kv, n_seq)
    for step in range(4000):
        seq = rng.randrange(n_seq)
        op = rng.random()
        if op < 0.45:
            n = rng.randrange(1, 6)
            kv.held[seq] = kv.held.get(seq, 0) + n  # what a decode step appends
            ledger.grow(seq, n)
        elif op < 0.65:
            ledger.keep_prefix(seq, rng.randrange(0, ledger.positions(seq) + 1))
        elif op < 0.72:
            ledger.remove(seq)
        elif op < 0.77:
            n = rng.randrange(0, 20)
            ledger.load(seq, bytes(n), n)
        else:
            src = rng.randrange(n_seq)
            if src != seq:
                ledger.copy(src, seq, rng.randrange(0, ledger.positions(src) + 1))
        # Read some counts (they are kept from here on), then check all of them.
        for s in rng.sample(range(n_seq), 3):
            ledger.exclusive_cells(s)
        for s in range(n_seq):
            assert ledger.exclusive_cells(s) == recount(ledger, s), (step, s)


def test_a_copy_between_streams_holds_cells_of_its_own():
    kv = StreamsKv()
    ledger = KvLedger(kv, 4)
    kv.held[0] = 100
    ledger.grow(0, 100)
    assert ledger.copy(0, 1, 60) == 60
    # Nothing shared: the fork's 60 cells are counted beside the parent's 100, and removing
    # either frees all of its own.
    assert ledger.cells_used() == 160
    assert ledger.exclusive_cells(0) == 100 and ledger.exclusive_cells(1) == 60
    assert ledger.span_cells() == 100  # a dense row reads its own stream: the fullest holds 100
    ledger.remove(0)
    assert ledger.cells_used() == 60 and ledger.positions(1) == 60
    # In the unified pool the same copy shares the parent's cells.
    shared = KvLedger(CountingKv(), 4)
    shared.kv.held[0] = 100
    shared.grow(0, 100)
    shared.copy(0, 1, 60)
    assert shared.cells_used() == 100 and shared.exclusive_cells(0) == 40
    shared.kv.held[2] = 30
    shared.grow(2, 30)
    assert shared.span_cells() == 130  # a dense row reads every cell of the pool


@pytest.mark.parametrize("streams", [False, True])
def test_an_idle_conversation_pays_rent_only_in_a_shared_pool(streams):
    """Dense attention: in a shared pool every running row reads an idle conversation's cells, so
    it is charged for them and evicted once that exceeds recomputing them; in a stream of its own
    no other row reads them, and it stays."""
    from scheduler.cost_model import CostModel, CostParams
    from scheduler.residency import Residency
    from scheduler.types import AttentionPath

    res = Residency(StreamsKv() if streams else CountingKv(), 4)
    res.adopt("idle", 0, list(range(500)), bytes(500))
    cost = CostModel(CostParams(fixed_ms=5.0, decode_ms=1.0, prefill_ms=1.0, attn_ms=1.0))
    evicted = [e for _ in range(50) for e in res.charge_idle_rent(512, AttentionPath.DENSE, cost)]
    assert evicted == ([] if streams else ["idle"])
    assert ("idle" in res.sessions) is streams
