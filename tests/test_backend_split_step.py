"""A step of prompt and decode rows on the CPU flash-attention kernel runs as two native calls."""

from __future__ import annotations

import numpy as np
import pytest

from backend.protocol import DecodeOutcome
from scheduler.types import BatchPlan, SamplingParams, SeqSlice
from tests.needs import need_real_model

pytestmark = pytest.mark.slow

TEXT = ("The lighthouse keeper counted the ships that passed each night, writing their names in a "
        "ledger that nobody else would ever read. ") * 12


def load(n_ctx: int):
    need_real_model()
    from backend.llama_backend import LlamaBackend

    return LlamaBackend.load(device="cpu", n_ctx=n_ctx, n_seq_max=4, n_batch=512, n_threads=1, flash_attn="on")


def fill(b, seq: int, tokens: list[int]) -> None:
    assert b.decode(BatchPlan(0, (SeqSlice(seq, 0, tuple(tokens), True, False),), 512)).outcome is DecodeOutcome.OK


SHIFT = 7  # sequence 2 reads the text from its 8th token: two different contexts


def mixed_plan(tokens: list[int], prompt_rows: int, depth: int) -> BatchPlan:
    return BatchPlan(1, (SeqSlice(0, 0, tuple(tokens[:prompt_rows]), True, False),
                         SeqSlice(1, depth, (tokens[depth],), True, True),
                         SeqSlice(2, depth, (tokens[SHIFT + depth],), True, True)), 512)


def test_a_split_step_gives_the_logits_one_call_gives_and_samples_from_held_rows():
    b = load(2048)
    try:
        assert b.attention_tile_rows == 64  # the CPU flash kernel: the step splits
        tokens = b.tokenize(TEXT)
        depth = 200
        fill(b, 1, tokens[:depth])
        fill(b, 2, tokens[SHIFT:SHIFT + depth])
        plan = mixed_plan(tokens, 100, depth)
        seen = {}
        for tile in (0, 64):  # 0: one native call, as on any other kernel
            b.attention_tile_rows = tile
            result = b.decode(plan)
            assert result.outcome is DecodeOutcome.OK
            seen[tile] = {seq: b.logits(row).copy() for seq, row in result.logit_rows.items()}
            if tile:
                # The prompt's row was read before the decode rows' call and held; a seeded chain
                # samples from it as from the context's own rows.
                assert result.logit_rows[0] >= b.n_batch
                b.set_sampler(0, SamplingParams(temperature=0.8, seed=3))
                assert 0 <= b.sample(0, result.logit_rows[0]) < b.n_vocab
                b.free_sampler(0)
            for seq, pos in ((0, 0), (1, depth), (2, depth)):
                b.kv_keep_prefix(seq, pos)
        for seq in (0, 1, 2):
            one, two = seen[0][seq], seen[64][seq]
            # Not bit for bit: the kernels differ (a decode row alone goes one row at a time, in
            # half precision), by a few tenths at most; a wrong row would be off by whole units.
            assert np.mean(np.abs(one - two)) < 0.2 and np.max(np.abs(one - two)) < 1.5, seq
            assert int(np.argmax(one)) == int(np.argmax(two)) or np.sort(one)[-1] - np.sort(one)[-2] < 0.5
    finally:
        b.close()


def test_the_few_rows_of_a_last_partial_tile_run_with_the_decode_rows_and_give_the_same_logits():
    b = load(2048)
    try:
        tokens = b.tokenize(TEXT)
        depth = 200
        fill(b, 1, tokens[:depth])
        fill(b, 2, tokens[SHIFT:SHIFT + depth])
        calls = []
        run = b._run

        def counted(slices):
            calls.append([(s.seq_id, s.pos0, len(s.tokens)) for s in slices])
            return run(slices)

        b._run = counted
        for plan in (mixed_plan(tokens, 69, depth),  # 64 + 5 prompt rows beside 2 decode rows
                     BatchPlan(1, mixed_plan(tokens, 69, depth).slices[:1], 512)):  # the prompt alone
            seen = {}
            for tile in (0, 64):
                b.attention_tile_rows = tile
                calls.clear()
                result = b.decode(plan)
                assert result.outcome is DecodeOutcome.OK
                seen[tile] = {seq: b.logits(row).copy() for seq, row in result.logit_rows.items()}
                assert b.kv_pos_max(0) == 68
                if tile:  # the 5 rows went one at a time with the decode rows, after the tile
                    assert calls[0] == [(0, 0, 64)] and calls[1][0] == (0, 64, 5)
                    assert [c[0] for c in calls[1][1:]] == [s.seq_id for s in plan.slices[1:]]
                else:
                    assert len(calls) == 1
                for seq, pos in ((0, 0), (1, depth), (2, depth)):
                    b.kv_keep_prefix(seq, pos)
            # The same rows as two steps of their own, the 5 under a tile (one at a time): the
            # split step gives their logits, where one call's tiled kernel differs a little (it
            # computes in single precision, the row-at-a-time kernel in half).
            b.attention_tile_rows = 64
            head, tail = BatchPlan(2, (SeqSlice(0, 0, tuple(tokens[:64]), False, False),), 512), \
                BatchPlan(3, (SeqSlice(0, 64, tuple(tokens[64:69]), True, False),) + plan.slices[1:], 512)
            assert b.decode(head).outcome is DecodeOutcome.OK
            result = b.decode(tail)
            apart = {seq: b.logits(row).copy() for seq, row in result.logit_rows.items()}
            for seq, pos in ((0, 0), (1, depth), (2, depth)):
                b.kv_keep_prefix(seq, pos)
            assert seen[0].keys() == seen[64].keys() == apart.keys()
            for seq in seen[0]:
                one, two = seen[0][seq], seen[64][seq]
                assert np.max(np.abs(two - apart[seq])) < 1e-3, seq
                assert np.mean(np.abs(one - two)) < 0.3 and np.max(np.abs(one - two)) < 1.5, seq
                assert int(np.argmax(one)) == int(np.argmax(two)) or np.sort(one)[-1] - np.sort(one)[-2] < 0.5
    finally:
        b.close()


def test_when_the_second_call_finds_no_room_the_step_commits_nothing():
    b = load(256)
    try:
        assert b.n_ctx == 256 and b.attention_tile_rows == 64
        tokens = b.tokenize(TEXT)
        fill(b, 1, tokens[:60])
        fill(b, 2, tokens[SHIFT:SHIFT + 60])
        used = b.kv_cells_used()
        # 136 prompt rows fill the cache; the two decode rows then find no cell.
        result = b.decode(mixed_plan(tokens, 256 - used, 60))
        assert result.outcome is not DecodeOutcome.OK and not result.logit_rows
        assert b.kv_pos_max(0) == -1 and b.kv_cells_used() == used
        # And the cache still serves: the same rows without the prompt run.
        assert b.decode(BatchPlan(2, mixed_plan(tokens, 1, 60).slices[1:], 512)).outcome is DecodeOutcome.OK
    finally:
        b.close()
