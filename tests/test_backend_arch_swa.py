"""A sliding-window model (tiny random Gemma 2 and 3, window 16) under every way the engine reuses KV:
a follow-up turn, an edit that keeps a prefix older than the window, a fork of a deep parent, a
saved and restored state; each greedy reply equals a cold run of the same prompt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.protocol import DecodeOutcome
from magnitude_tui.engine.core import Engine
from scheduler.types import BatchPlan, SeqSlice
from tests.arch_gguf import arch_model
from tests.engine_driver import Driver, close_and_assert_empty
from tests.needs import need_real_model

WINDOW = 16
COLD = 3  # the sequence cold runs use


@pytest.fixture(scope="module", params=[("gemma2", "off"), ("gemma3", "on")], ids=lambda p: f"{p[0]}-flash-{p[1]}")
def swa(request, tmp_path_factory):
    """The backend over a tiny Gemma (flash attention off for one, on for the other): 4
    sequences, 1,024 cells, 64-row ubatches."""
    need_real_model()
    from backend.llama_backend import LlamaBackend
    from backend.llama_load import default_model_path

    arch, flash = request.param
    path = arch_model(tmp_path_factory.mktemp("arch") / f"{arch}.gguf", Path(default_model_path()),
                      arch=arch, sliding_window=WINDOW)
    backend = LlamaBackend.load(model_path=str(path), device="cpu", n_ctx=1024, n_seq_max=4, n_batch=256,
                                n_ubatch=64, n_threads=1, flash_attn=flash)
    assert backend.n_swa == WINDOW and backend.info["sliding_window"] == WINDOW
    yield backend
    backend.close()


@pytest.fixture
def b(swa):
    for s in range(swa.n_seq_max):
        swa.kv_remove(s)
    yield swa
    for s in range(swa.n_seq_max):
        swa.kv_remove(s)


TOKENS = [int(t) for t in np.random.default_rng(1).integers(100, 40000, 400)]


def feed(b, seq: int, pos0: int, tokens) -> np.ndarray:
    """Evaluate `tokens` from `pos0` in chunks; the last row's logits."""
    row = None
    for i in range(0, len(tokens), 200):
        chunk = tuple(tokens[i:i + 200])
        r = b.decode(BatchPlan(0, (SeqSlice(seq, pos0 + i, chunk, True, False),), 0))
        assert r.outcome is DecodeOutcome.OK, r
        row = r.logit_rows[seq]
    return b.logits(row).copy()


def reply(b, seq: int, history: list[int], n: int = 10) -> list[int]:
    """Greedy continuation of `history`, of which `seq` holds what kv_pos_max says."""
    held = b.kv_pos_max(seq) + 1
    logits = feed(b, seq, held, history[held:])
    out = []
    for k in range(n):
        out.append(int(np.argmax(logits)))
        r = b.decode(BatchPlan(0, (SeqSlice(seq, len(history) + k, (out[-1],), True, True),), 0))
        assert r.outcome is DecodeOutcome.OK, r
        logits = b.logits(r.logit_rows[seq]).copy()
    return out


def cold(b, history: list[int], n: int = 10) -> list[int]:
    b.kv_remove(COLD)
    out = reply(b, COLD, history, n)
    b.kv_remove(COLD)
    return out


def test_an_edit_keeps_a_prefix_older_than_the_window(b):
    """A 300-token conversation, then an edit keeping its first 40 tokens. The window layers had
    only window x 4 + 64 cells (256): they had dropped the first positions, so llama.cpp's own
    pos_max said -1 (PlanError) at 40 and gave wrong logits at 50."""
    for keep in (40, 50, 150):
        b.kv_remove(0)
        feed(b, 0, 0, TOKENS[:300])
        b.kv_keep_prefix(0, keep)
        history = TOKENS[:keep] + [7, 8, 9]
        assert reply(b, 0, history) == cold(b, history), f"kept {keep}"


def test_a_fork_of_a_deep_parent_finds_room_and_continues_it(b):
    """Before: the child's first row found no cell (NO_KV_SLOT) in a pool three quarters free."""
    feed(b, 0, 0, TOKENS[:300])
    for n in (300, 150):
        b.kv_copy(0, 1, n)
        assert b.kv_pos_max(1) == n - 1
        history = TOKENS[:n] + [5, 6, 7]
        assert reply(b, 1, history) == cold(b, history), f"forked at {n}"


def test_a_prefix_whose_window_cells_were_taken_is_evaluated_again(b):
    """Even with full-size window layers llama.cpp takes a sequence's cells that lie outside its
    window as seen from its end: here two sequences decode in lockstep, one goes, and the other's
    next chunk fills the holes and takes its own old cells. A prefix ending inside the lost part
    is then not usable: the backend empties the sequence and the prefix is evaluated again.
    Before: it kept 115 positions whose window layers lacked 100..109 (max logit error 2.3)."""
    history = interleave_then_chunk(b)
    assert b.kv_pos_max(0) + 1 == len(history)
    import llama_cpp

    lost_below = llama_cpp.llama_memory_seq_pos_min(b._mem, 0)
    assert lost_below > 0, "the scenario no longer makes llama.cpp take cells: it proves nothing"
    keep = lost_below + 5
    b.kv_keep_prefix(0, keep)
    assert b.kv_pos_max(0) == -1
    edited = history[:keep] + [7, 8, 9]
    assert reply(b, 0, edited) == cold(b, edited)
    b.kv_remove(0)
    history = interleave_then_chunk(b)
    b.kv_copy(0, 1, keep)  # a fork from before the lost part gets nothing either
    assert b.kv_pos_max(1) == -1
    b.kv_keep_prefix(0, lost_below + WINDOW)  # a prefix whose window is intact stays
    assert b.kv_pos_max(0) == lost_below + WINDOW - 1


def interleave_then_chunk(b) -> list[int]:
    """Seq 0: 100 prompt tokens, 100 decode rows beside seq 1's, then (seq 1 gone) 40 more."""
    history = TOKENS[:100]
    t0 = int(np.argmax(feed(b, 0, 0, history)))
    t1 = int(np.argmax(feed(b, 1, 0, TOKENS[200:220])))
    for k in range(100):
        r = b.decode(BatchPlan(0, (SeqSlice(0, 100 + k, (t0,), True, True),
                                   SeqSlice(1, 20 + k, (t1,), True, True)), 0))
        assert r.outcome is DecodeOutcome.OK, r
        history.append(t0)
        t0, t1 = (int(np.argmax(b.logits(r.logit_rows[s]))) for s in (0, 1))
    b.kv_remove(1)
    feed(b, 0, len(history), TOKENS[300:340])
    return history + TOKENS[300:340]


def test_a_restored_state_continues_from_a_shorter_prefix(b):
    feed(b, 0, 0, TOKENS[:300])
    state = b.kv_save(0)
    b.kv_remove(0)
    assert b.kv_load(0, state) == 300
    b.kv_keep_prefix(0, 60)
    history = TOKENS[:60] + [5, 6, 7]
    assert reply(b, 0, history) == cold(b, history)


def test_the_engine_serves_turns_forks_and_edits_as_cold_runs(b):
    """Through the scheduler: two conversations reply side by side, one is closed, the other's
    next turn goes past the window (its chunk takes cells the closed one left and some of its
    own old ones), a fork continues it, and an edit goes back to 40 tokens. Each reply equals
    the same prompt run cold (every other conversation closed). Before: the edit's 40 positions
    were kept though the window layers had dropped 25..39 of them, and its reply differed."""
    import llama_cpp

    engine = Engine(b, policy="fixed:64", coalesce_ms=0.0)
    d = Driver(engine)

    def run(rid, session, tokens, fork_from=None, max_tokens=10) -> str:
        d.submit(rid, session, prompt_tokens=tokens, max_tokens=max_tokens, fork_from=fork_from)
        d.run_until_done(rid)
        assert d.seen[rid].last.error is None, d.seen[rid].last.error
        return d.seen[rid].text

    d.submit("a1", "a", prompt_tokens=TOKENS[:100], max_tokens=60)
    d.submit("b1", "b", prompt_tokens=TOKENS[200:220], max_tokens=60)
    d.run_until_done("a1", "b1")
    engine.close_session("b")
    prompts = {"turn": engine.scheduler.sessions["a"].committed_tokens() + TOKENS[300:340]}
    got = {"turn": run("a2", "a", prompts["turn"])}
    slot = engine.scheduler.sessions["a"].seq_id
    assert llama_cpp.llama_memory_seq_pos_min(b._mem, slot) > 40, "no cell was taken: the test proves nothing"
    prompts["fork"] = engine.scheduler.sessions["a"].committed_tokens() + [31]
    got["fork"] = run("f1", "child", prompts["fork"], fork_from="a")
    assert d.seen["f1"].last.cached_tokens == len(prompts["fork"]) - 1
    prompts["edit"] = TOKENS[:40] + [21, 22]
    got["edit"] = run("a3", "a", prompts["edit"])
    assert d.seen["a3"].last.cached_tokens == 0  # evaluated again: the kept prefix was not usable
    close_and_assert_empty(engine, "a", "child")
    for name, prompt in prompts.items():
        assert run(f"cold-{name}", f"cold-{name}", prompt) == got[name], name
        close_and_assert_empty(engine, f"cold-{name}")


def test_a_restore_that_cannot_be_continued_from_is_refused_with_nothing_held(b):
    """A saved state holds only the window's cells of the window layers: restoring its first 60
    of 300 positions would continue from cells that are not there. The conversation starts cold
    instead (warm resume reports `refused`); restoring all 300 works."""
    from scheduler.residency import Residency

    feed(b, 0, 0, TOKENS[:300])
    state = b.kv_save(0)
    b.kv_remove(0)
    res = Residency(b, b.n_seq_max)
    with pytest.raises(ValueError, match="cannot be continued from"):
        res.adopt("cut", 1, TOKENS[:60], state)
    assert b.kv_pos_max(1) == -1 and res.kv.positions(1) == 0 and "cut" not in res.sessions
    res.adopt("whole", 1, TOKENS[:300], state)
    assert b.kv_pos_max(1) == 299 and res.kv.positions(1) == 300


def test_a_draft_model_with_a_window_drafts_again_after_an_edit_older_than_its_window(tmp_path):
    """A sliding-window draft model (a Gemma 3 270M drafting for Gemma 3): two conversations
    drafted side by side, one forgotten, the other grown on alone (llama.cpp then takes its old
    cells), then edited back to 40 tokens. The draft emptied the slot it could not continue from,
    but its own list kept 40 tokens: the next draft step planned from position 40 on an empty
    sequence, and the PlanError ended the engine's worker."""
    need_real_model()
    from backend.draft_model import DraftModelSource
    from backend.llama_backend import LlamaBackend
    from backend.llama_load import default_model_path
    from scheduler.drafts import DraftWant

    path = arch_model(tmp_path / "gemma2.gguf", Path(default_model_path()), arch="gemma2", sliding_window=WINDOW)
    backend = LlamaBackend.load(model_path=str(path), device="cpu", n_ctx=1024, n_seq_max=4, n_batch=256,
                                n_ubatch=64, n_threads=1, flash_attn="off")
    try:
        src = DraftModelSource(backend)
        other = [int(t) for t in np.random.default_rng(2).integers(100, 40000, 400)]
        for n in range(20, 220, 20):
            src.propose_many([DraftWant(0, TOKENS[:n], 4), DraftWant(1, other[:n], 4)])
        src.forget(1)
        for n in range(220, 320, 20):
            src.propose_many([DraftWant(0, TOKENS[:n], 4)])
        edited = TOKENS[:40] + [5, 6, 7]
        out = src.propose_many([DraftWant(0, edited, 4)])
        assert len(out[0]) == 4
        slot = src._held[0].slot
        assert backend.kv_pos_max(slot) + 1 == len(src._held[0].tokens) == len(edited)
    finally:
        backend.close()
