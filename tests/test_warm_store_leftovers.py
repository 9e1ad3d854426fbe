"""What a warm-store writer killed mid-write leaves (a `.tmp` beside the states) does not stay on
disk for good: outside the byte budget it takes room, and its tokens are the conversation's text,
which deleting the conversation must delete."""

from __future__ import annotations

import os
import time

from magnitude_tui.engine.warm_store import STALE_TMP_S, WarmStore, discard_saved


def _leftover(store: WarmStore, session_id: str, age_s: float):
    tmp = store.path_for(session_id).with_suffix(".tmp")
    tmp.write_bytes(b"half a state")
    then = time.time() - age_s
    os.utime(tmp, (then, then))
    return tmp


def test_deleting_a_conversation_deletes_its_half_written_state(tmp_path):
    store = WarmStore(tmp_path, layout="L", budget_bytes=1 << 20)
    store.write("s1", [1, 2, 3], b"state")
    tmp = _leftover(store, "s1", age_s=0)
    other = _leftover(store, "s2", age_s=0)
    discard_saved(tmp_path, "s1")
    assert not tmp.exists() and not store.files()
    assert other.exists()  # another conversation's is not touched


def test_an_old_leftover_goes_when_the_store_opens_and_a_fresh_one_stays(tmp_path):
    store = WarmStore(tmp_path, layout="L", budget_bytes=1 << 20)
    old = _leftover(store, "s1", age_s=STALE_TMP_S + 60)
    fresh = _leftover(store, "s2", age_s=1)  # may be a writer's, still running
    WarmStore(tmp_path, layout="L", budget_bytes=1 << 20)
    assert not old.exists() and fresh.exists()
