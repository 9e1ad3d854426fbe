"""Warm resume on the fake backend: idle conversations' KV saved to disk, restored on resume,
refused (cold start, never a crash) when anything does not match."""

from __future__ import annotations

import struct

import pytest

from backend.fake import FakeBackend
from magnitude_tui.engine.core import Engine
from magnitude_tui.engine.events import ForgetSession, RestoreOutcome, SeqUpdate, SessionRestored, Shutdown
from magnitude_tui.engine.warm import SAVE_AFTER_S
from magnitude_tui.engine.warm_store import MAGIC, WarmStore
from scheduler.types import Message, Phase, Request, SamplingParams

HISTORY = "Tell me about lighthouses and the keepers who lived in them, at some length please."
REPLY_TOKENS = 40


class ManualClock:
    """Time that moves only when the test says (or the engine sleeps through a window)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _engine(tmp_path, *, budget: int = 1 << 30, backend: FakeBackend | None = None, warm: bool = True):
    backend = backend or FakeBackend(n_ctx=4096, n_seq_max=4)
    clock = ManualClock()
    store = WarmStore(tmp_path / "kv", layout=backend.state_layout, budget_bytes=budget) if warm else None
    return Engine(backend, clock=clock, policy="fixed:64", warm=store), clock


def _turn(engine: Engine, rid: str, sid: str, messages: list[Message]) -> list[SeqUpdate]:
    engine.submit(Request(rid, sid, tuple(messages), SamplingParams(max_tokens=REPLY_TOKENS)))
    reports = engine.run_until_idle()
    return [u for r in reports for u in r.updates if u.request_id == rid]


def _reply(updates: list[SeqUpdate]) -> str:
    return "".join(u.text_delta for u in updates)


def _first_exchange(engine: Engine, sid: str = "s1") -> list[Message]:
    """One turn and its reply; returns the conversation so far."""
    asked = [Message("user", HISTORY)]
    reply = _reply(_turn(engine, f"{sid}:1", sid, asked))
    return asked + [Message("assistant", reply)]


def _idle_save(engine: Engine, clock: ManualClock) -> None:
    clock.now += SAVE_AFTER_S + 0.1
    engine.step()
    engine.warm.store.flush()


def total_bytes(store: WarmStore) -> int:
    return sum(p.stat().st_size for p in store.files())


def _restore(engine: Engine, sid: str, messages: list[Message]) -> SessionRestored:
    engine.restore_session(sid, messages)
    engine.step()
    [notice] = engine.take_notices()
    return notice


def test_a_conversation_is_saved_once_it_has_been_idle_a_while(tmp_path):
    engine, clock = _engine(tmp_path)
    _first_exchange(engine)
    store = engine.warm.store
    engine.step()
    store.flush()
    assert store.files() == [], "saved before the conversation had been idle SAVE_AFTER_S"
    _idle_save(engine, clock)
    [path] = store.files()
    saved = store.load("s1").saved
    slot = engine.scheduler.sessions["s1"].seq_id
    assert saved.tokens == engine.backend.kv_tokens(slot)  # exactly what the KV holds
    assert len(saved.tokens) > len(HISTORY)
    engine.step()
    assert engine.warm.num_saved == 1, "an unchanged conversation is not saved again"


def test_a_restored_conversation_prefills_only_the_new_turn_and_answers_alike(tmp_path):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    follow_up = history + [Message("user", "And the most famous one?")]
    never_interrupted = _turn(first, "s1:2", "s1", follow_up)

    resumed, _ = _engine(tmp_path)  # a new engine (a restarted app) on the same disk
    notice = _restore(resumed, "s1", history)
    assert notice.outcome is RestoreOutcome.RESTORED and notice.state_bytes > 0
    assert notice.tokens == len(first.warm.store.load("s1").saved.tokens)
    # Its cells are counted as any resident idle conversation's, and match the native cache.
    assert resumed.leaks() == []
    assert resumed.scheduler.kv_used() == notice.tokens == resumed.scheduler.kv_idle()
    warm = _turn(resumed, "s1:2", "s1", follow_up)
    assert warm[-1].cached_tokens == notice.tokens == never_interrupted[-1].cached_tokens
    assert _reply(warm) == _reply(never_interrupted)
    assert resumed.backend.states_loaded == 1

    cold, _ = _engine(tmp_path, warm=False)
    assert _turn(cold, "s1:2", "s1", follow_up)[-1].cached_tokens == 0


def test_a_restored_conversation_is_forked_and_evicted_like_any_resident_one(tmp_path):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    resumed, _ = _engine(tmp_path, backend=FakeBackend(n_ctx=4096, n_seq_max=2))
    restored = _restore(resumed, "s1", history).tokens
    fork = Request("sub:1", "sub", tuple(history + [Message("user", "Your task: one idea.")]),
                   SamplingParams(max_tokens=REPLY_TOKENS), fork_from="s1")
    resumed.submit(fork)
    done = [u for r in resumed.run_until_idle() for u in r.updates if u.request_id == "sub:1"][-1]
    assert done.cached_tokens == restored and done.error is None  # the subagent shares its cells
    assert resumed.leaks() == []
    # Both slots are held by idle conversations; a newcomer evicts the least recently used.
    _turn(resumed, "new:1", "new", [Message("user", "hello")])
    assert "s1" not in resumed.scheduler.sessions and resumed.leaks() == []


def test_resume_before_anything_was_saved_starts_cold(tmp_path):
    engine, _ = _engine(tmp_path)
    notice = _restore(engine, "never-saved", [Message("user", HISTORY)])
    assert notice.outcome is RestoreOutcome.NOT_SAVED
    assert engine.scheduler.kv_used() == 0 and engine.is_empty()


def test_a_state_saved_under_another_model_or_build_is_ignored(tmp_path, caplog):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    other, _ = _engine(tmp_path, backend=FakeBackend(n_ctx=4096, n_seq_max=4, name="other-model"))
    notice = _restore(other, "s1", history)
    assert notice.outcome is RestoreOutcome.OTHER_LAYOUT and "other-model" in notice.detail
    assert "starts cold" in caplog.text
    assert other.backend.states_loaded == 0 and other.is_empty()
    updates = _turn(other, "s1:2", "s1", history + [Message("user", "next")])
    assert updates[-1].phase is Phase.DONE and updates[-1].cached_tokens == 0


def test_an_edited_conversation_keeps_only_the_part_that_still_matches(tmp_path):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    saved = first.warm.store.load("s1").saved.tokens

    edited_reply, _ = _engine(tmp_path)
    changed = history[:1] + [Message("assistant", "Something else entirely.")]
    notice = _restore(edited_reply, "s1", changed)
    assert notice.outcome is RestoreOutcome.RESTORED
    assert 0 < notice.tokens < len(saved) and "no longer match" in notice.detail
    assert edited_reply.leaks() == [] and edited_reply.scheduler.kv_used() == notice.tokens

    edited_question, _ = _engine(tmp_path)
    notice = _restore(edited_question, "s1", [Message("system", "Be brief."), *history])
    assert notice.outcome is RestoreOutcome.TOKENS_DIFFER
    assert edited_question.is_empty()


@pytest.mark.parametrize("damage", ["flip a state byte", "truncate", "garbage", "header not an object"])
def test_a_damaged_file_is_reported_deleted_and_never_loaded(tmp_path, damage):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    [path] = first.warm.store.files()
    data = bytearray(path.read_bytes())
    if damage == "flip a state byte":
        data[-3] ^= 0xFF
    elif damage == "truncate":
        del data[len(data) // 2:]
    elif damage == "garbage":
        data[:] = b"\x00not a saved state at all" * 10
    else:
        data[:] = MAGIC + struct.pack("<I", 2) + b"[]"
    path.write_bytes(bytes(data))

    resumed, _ = _engine(tmp_path)
    notice = _restore(resumed, "s1", history)
    assert notice.outcome is RestoreOutcome.CORRUPT and "damaged" in notice.detail
    assert not path.exists() and resumed.backend.states_loaded == 0 and resumed.is_empty()
    assert _turn(resumed, "s1:2", "s1", history + [Message("user", "next")])[-1].cached_tokens == 0


def test_a_state_the_backend_refuses_leaves_nothing_held(tmp_path):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    resumed, _ = _engine(tmp_path)
    resumed.backend.kv_load = lambda seq_id, state: (_ for _ in ()).throw(ValueError("native refusal"))
    notice = _restore(resumed, "s1", history)
    assert notice.outcome is RestoreOutcome.REFUSED and "native refusal" in notice.detail
    assert resumed.is_empty()


def test_no_restore_takes_room_from_anyone(tmp_path):
    first, clock = _engine(tmp_path)
    history = _first_exchange(first)
    _idle_save(first, clock)
    full, _ = _engine(tmp_path, backend=FakeBackend(n_ctx=4096, n_seq_max=1))
    _turn(full, "o0:1", "o0", [Message("user", "hello")])  # holds the only slot, idle
    notice = _restore(full, "s1", history)
    assert notice.outcome is RestoreOutcome.NO_ROOM and "slot" in notice.detail
    assert "o0" in full.scheduler.sessions and "s1" not in full.scheduler.sessions


def test_the_disk_budget_drops_the_least_recently_used_state(tmp_path):
    engine, clock = _engine(tmp_path)
    for sid in ("a", "b"):
        _first_exchange(engine, sid)
        _idle_save(engine, clock)
    store = engine.warm.store
    one = total_bytes(store) // 2
    store.budget_bytes = 2 * one + one // 2  # room for two states, not three
    assert store.load("a").saved is not None  # a load is a use: "b" is now the oldest
    _first_exchange(engine, "c")
    _idle_save(engine, clock)
    assert store.load("b").found.value == "nothing"
    assert store.load("a").saved is not None and store.load("c").saved is not None
    assert total_bytes(store) <= store.budget_bytes and store.num_evicted == 1


def test_a_state_over_the_whole_budget_is_not_saved(tmp_path):
    engine, clock = _engine(tmp_path, budget=64)
    _first_exchange(engine)
    _idle_save(engine, clock)
    assert engine.warm.store.files() == []


def test_quitting_saves_what_the_debounce_had_not_saved_yet(tmp_path):
    engine, _ = _engine(tmp_path)
    history = _first_exchange(engine)
    engine.shutdown()  # at once: no idle wait
    resumed, _ = _engine(tmp_path)
    assert _restore(resumed, "s1", history).outcome is RestoreOutcome.RESTORED


def test_an_engine_that_saves_nothing_says_so(tmp_path):
    engine, _ = _engine(tmp_path, warm=False)
    assert _restore(engine, "s1", [Message("user", HISTORY)]).outcome is RestoreOutcome.UNSUPPORTED


def test_forgetting_a_conversation_ends_it_and_deletes_its_saved_kv(tmp_path):
    # A deleted conversation: the engine, which wrote the files, deletes them (ForgetSession), and
    # a conversation still idle and unsaved is never saved afterwards.
    engine, clock = _engine(tmp_path)
    _first_exchange(engine, "gone")
    _idle_save(engine, clock)
    _first_exchange(engine, "kept")
    _idle_save(engine, clock)
    _first_exchange(engine, "unsaved")
    store = engine.warm.store
    assert len(store.files()) == 2
    engine.apply(ForgetSession("gone"))
    engine.apply(ForgetSession("unsaved"))
    _idle_save(engine, clock)
    assert [p.name for p in store.files()] == [store.path_for("kept").name]
    assert set(engine.scheduler.sessions) == {"kept"}
    assert _restore(engine, "gone", [Message("user", HISTORY)]).outcome is RestoreOutcome.NOT_SAVED


def test_a_conversation_forgotten_just_before_quitting_is_not_saved_on_the_way_out(tmp_path):
    # Both idle and unsaved; the forget and the quit arrive together: the quit applies the forget
    # first, then saves what is left.
    engine, _ = _engine(tmp_path)
    _first_exchange(engine, "gone")
    _first_exchange(engine, "kept")
    store = engine.warm.store
    assert store.files() == []
    engine.apply(ForgetSession("gone"))
    engine.apply(Shutdown())
    assert [p.name for p in store.files()] == [store.path_for("kept").name]


def test_a_worker_client_forgets_a_conversation_through_its_engine_or_itself_when_none_runs(tmp_path):
    from backend.factory import BackendConfig
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.engine.protocol import seq_updates
    from magnitude_tui.engine.waiting import events_until, wait_ready

    kv = tmp_path / "kv"
    client = WorkerClient(EngineConfig(BackendConfig("fake"), warm_dir=str(kv), warm_budget_mb=64), in_process=True)
    client.start()
    wait_ready(client, timeout_s=30)
    for sid in ("s1", "s2"):
        client.submit(Request(f"{sid}:1", sid, (Message("user", HISTORY),), SamplingParams(max_tokens=8)))
    events_until(client, lambda evs: sum(u.phase is Phase.DONE for u in seq_updates(evs)) == 2, timeout_s=30)
    client.stop()  # saves what is idle and unsaved on the way out
    assert len(list(kv.glob("*.kv*"))) == 2, list(kv.iterdir())

    client = WorkerClient(client.config, in_process=True)  # the app started again
    client.start()
    wait_ready(client, timeout_s=30)
    client.forget("s1")  # through the engine, which wrote the files
    client.restore_session("s1", (Message("user", HISTORY),))
    evs = events_until(client, lambda evs: any(isinstance(e, SessionRestored) for e in evs), timeout_s=30)
    assert [e.outcome for e in evs if isinstance(e, SessionRestored)] == [RestoreOutcome.NOT_SAVED]
    client.stop()
    assert len(list(kv.glob("*.kv*"))) == 1

    client.forget("s2")  # no engine running: the client deletes the files itself
    assert list(kv.glob("*.kv*")) == []


def test_a_write_that_fails_midway_leaves_no_partial_file_and_the_old_state(tmp_path, monkeypatch):
    store = WarmStore(tmp_path / "kv", layout="test", budget_bytes=1 << 20)
    store.write("s1", [1, 2, 3], b"old state")
    before = {p.name: p.read_bytes() for p in (tmp_path / "kv").iterdir()}
    real_open = open

    class FullDisk:
        def __init__(self, f) -> None:
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            if len(data) > 100:  # the header goes in; the KV state does not fit
                raise OSError(28, "No space left on device")
            return self.f.write(data)

    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: FullDisk(real_open(p, mode, *a, **k))
                        if str(p).endswith(".tmp") else real_open(p, mode, *a, **k))
    with pytest.raises(OSError, match="No space"):
        store.write("s1", [1, 2, 3, 4], b"new state " * 50)
    after = {p.name: p.read_bytes() for p in (tmp_path / "kv").iterdir()}
    assert after == before  # no .tmp left behind, the saved state as it was


def test_a_conversation_evicted_before_its_save_is_saved_from_host_memory_on_the_way_out(tmp_path):
    engine, _ = _engine(tmp_path, backend=FakeBackend(n_ctx=4096, n_seq_max=2))
    history = _first_exchange(engine)
    for other in ("x", "y"):  # both slots taken at once, before s1 was idle long enough to be saved
        _turn(engine, f"{other}:1", other, [Message("user", "hello")])
    assert "s1" not in engine.scheduler.sessions and "s1" in engine.scheduler.residency.ram
    assert engine.warm.store.files() == []
    engine.shutdown()
    resumed, _ = _engine(tmp_path)
    notice = _restore(resumed, "s1", history)
    assert notice.outcome is RestoreOutcome.RESTORED and notice.tokens >= len(HISTORY)


def test_without_the_host_memory_tier_an_evicted_conversation_is_not_saved(tmp_path):
    backend = FakeBackend(n_ctx=4096, n_seq_max=2)
    store = WarmStore(tmp_path / "kv", layout=backend.state_layout, budget_bytes=1 << 30)
    engine = Engine(backend, clock=ManualClock(), policy="fixed:64", warm=store, ram_bytes=0)
    history = _first_exchange(engine)
    for other in ("x", "y"):
        _turn(engine, f"{other}:1", other, [Message("user", "hello")])
    assert "s1" not in engine.scheduler.sessions
    engine.shutdown()
    resumed, _ = _engine(tmp_path)
    assert _restore(resumed, "s1", history).outcome is RestoreOutcome.NOT_SAVED
