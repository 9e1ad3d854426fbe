"""Malformed requests and commands fail alone, with a clear error, while good requests complete."""

from __future__ import annotations

import pytest

from backend.fake import DEFAULT_REPLY, FakeBackend
from magnitude_tui.engine.events import RejectReason
from magnitude_tui.reliability.cases import BAD_REQUESTS
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text

GOOD = chat("good", "g", "hello", max_tokens=20)


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_a_malformed_request_fails_alone_and_a_good_one_completes(name):
    bad, words = BAD_REQUESTS[name]
    engine, _ = engine_for(FakeBackend(n_ctx=1024))
    engine.submit(GOOD)
    engine.submit(bad)
    engine.submit(chat("after", "a", "and you?", max_tokens=5))
    ups = by_request(engine.run_until_idle())
    [done] = [u for u in ups["bad"] if u.phase is Phase.DONE]
    assert done.done_reason is DoneReason.ERROR and words in done.error, done.error
    assert ups["bad"][-1] is done  # nothing after its end
    assert text(ups["good"]) == DEFAULT_REPLY[:20] and ups["good"][-1].done_reason is DoneReason.LENGTH
    assert ups["after"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "g", "a")


def test_max_tokens_beyond_the_context_runs_until_the_context_is_full():
    engine, _ = engine_for(FakeBackend(n_ctx=256))
    engine.submit(chat("huge", "s", "hi", max_tokens=10**9))
    last = by_request(engine.run_until_idle())["huge"][-1]
    assert last.done_reason is DoneReason.LENGTH and last.prompt_total + last.generated == 256
    assert_clean(engine, "s")


@pytest.mark.parametrize("thing", [None, 42, {"request_id": "x"}, "r0"])
def test_a_submit_that_is_not_a_request_is_rejected_apart(thing):
    engine, _ = engine_for()
    engine.submit(GOOD)
    engine.submit(thing)
    reports = engine.run_until_idle()
    rejected = [r for rep in reports for r in rep.rejected]
    assert [r.reason for r in rejected] == [RejectReason.MALFORMED] and "expected a Request" in rejected[0].message
    assert by_request(reports)["good"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "g")


def test_a_request_without_a_usable_id_is_rejected_apart():
    engine, _ = engine_for()
    engine.submit(GOOD)
    engine.submit(Request(None, "s", (Message("user", "hi"),)))
    engine.submit(Request("", "s", (Message("user", "hi"),)))
    engine.submit(Request("x", ["not", "text"], (Message("user", "hi"),)))
    reports = engine.run_until_idle()
    rejected = [r for rep in reports for r in rep.rejected]
    assert [r.reason for r in rejected] == [RejectReason.BAD_ID] * 3
    assert "request_id must be a string" in rejected[0].message and "empty" in rejected[1].message
    assert set(by_request(reports)) == {"good"}
    assert_clean(engine, "g")


def test_a_reused_request_id_is_rejected_apart_and_the_original_streams_on_to_one_done():
    engine, _ = engine_for()
    engine.submit(chat("r0", "s0", "first", max_tokens=30))
    reports = [engine.step() for _ in range(3)]
    engine.submit(chat("r0", "s1", "second", max_tokens=30))
    reports += engine.run_until_idle()
    rejected = [r for rep in reports if rep for r in rep.rejected]
    assert len(rejected) == 1
    assert rejected[0].reason is RejectReason.DUPLICATE_ID and rejected[0].session_id == "s1"
    assert "already in use" in rejected[0].message
    ups = by_request([r for r in reports if r])["r0"]
    assert all(u.session_id == "s0" for u in ups)  # no update of the original's id is the rejection
    assert [u.phase for u in ups].count(Phase.DONE) == 1 and ups[-1].done_reason is DoneReason.LENGTH
    assert text(ups) == DEFAULT_REPLY[:30]
    assert_clean(engine, "s0")


def test_an_id_may_be_reused_once_its_request_is_done():
    engine, _ = engine_for()
    engine.submit(chat("r0", "s0", "first", max_tokens=3))
    engine.run_until_idle()
    engine.submit(chat("r0", "s0", "again", max_tokens=3))
    reports = engine.run_until_idle()
    assert not [r for rep in reports for r in rep.rejected]
    assert by_request(reports)["r0"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "s0")


@pytest.mark.parametrize("policy", [None, 50, "", "fast", "target:nan", "fixed:0"])
def test_a_malformed_policy_is_refused_at_once_and_the_engine_goes_on(policy):
    engine, _ = engine_for(policy="fixed:64")
    engine.submit(GOOD)
    with pytest.raises(ValueError, match="policy"):
        engine.set_policy(policy)
    assert engine.policy == "fixed:64"
    assert by_request(engine.run_until_idle())["good"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "g")


@pytest.mark.parametrize("value", [None, 3, ["r"]])
def test_cancel_and_close_with_a_malformed_id_are_refused_at_once(value):
    engine, _ = engine_for()
    engine.submit(GOOD)
    with pytest.raises(ValueError):
        engine.cancel(value)
    with pytest.raises(ValueError):
        engine.close_session(value)
    assert by_request(engine.run_until_idle())["good"][-1].done_reason is DoneReason.LENGTH
    assert_clean(engine, "g")


def test_fork_from_a_closed_conversation_is_an_error_not_a_silent_cold_start():
    engine, _ = engine_for()
    engine.submit(chat("p", "parent", "context", max_tokens=3))
    engine.run_until_idle()
    engine.close_session("parent")
    engine.submit(chat("c", "child", "task", max_tokens=3, fork_from="parent"))
    last = by_request(engine.run_until_idle())["c"][-1]
    assert last.done_reason is DoneReason.ERROR and "fork_from 'parent'" in last.error
    assert_clean(engine)


def test_a_fork_whose_idle_parent_holds_the_room_starts_cold():
    # The numbers: n_ctx 800, a parent holding 510 cells, a child sharing nothing.
    engine, backend = engine_for(FakeBackend(n_ctx=800, n_seq_max=4, eog_after=0), gen_reserve=16)
    engine.submit(Request("p", "parent", (), SamplingParams(max_tokens=1), prompt_tokens=tuple(range(100, 610))))
    assert by_request(engine.run_until_idle())["p"][-1].done_reason is DoneReason.STOP
    assert backend.kv_cells_used() == 510
    engine.submit(Request("c", "child", (), SamplingParams(max_tokens=4), fork_from="parent",
                          prompt_tokens=tuple(range(1000, 1413))))
    last = by_request(engine.run_until_idle())["c"][-1]
    assert last.error is None and last.done_reason is DoneReason.STOP, last.error
    assert last.cached_tokens == 0 and "parent" not in engine.scheduler.sessions
    assert_clean(engine, "child")
