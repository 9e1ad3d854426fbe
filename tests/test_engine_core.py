"""Engine behaviour on the fake and simulated backends: phases and metrics, preparing notices,
length limits, prompt reuse and forks, cancellation, idle coalescing, slot eviction, policy changes,
commands from other threads."""

from __future__ import annotations

import threading
import time

import pytest

from backend.fake import DEFAULT_REPLY, FakeBackend
from backend.simulated import SimulatedBackend, VirtualClock
from magnitude_tui.engine.core import Engine
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text


def test_a_request_goes_through_its_phases_and_reports_metrics():
    backend = SimulatedBackend("cpu2core", n_ctx=4096, n_batch=512, eog_after=12)
    engine, _ = engine_for(backend, policy="fixed:16", coalesce_ms=5)
    engine.submit(chat("r", "s", "hello there"))
    ups = by_request(engine.run_until_idle())["r"]
    phases = [p for i, p in enumerate(u.phase for u in ups) if i == 0 or ups[i - 1].phase != p]
    # Preparing lasts through the idle coalescing window (admission, with its cache lookup, comes
    # after it); no slot or KV room was ever missing, so it never showed queued.
    assert phases == [Phase.PREPARING, Phase.PREFILL, Phase.GENERATING, Phase.DONE]
    assert ups[0].prompt_total == ups[-1].prompt_total and ups[0].seq_id is None
    last = ups[-1]
    assert text(ups) == DEFAULT_REPLY[:12] and last.generated == 12
    assert last.done_reason is DoneReason.STOP and last.error is None
    assert last.prompt_done == last.prompt_total == len(backend.tokenize_chat([Message("user", "hello there")]))
    assert [u.prompt_done for u in ups[1:3]] == [16, last.prompt_total]  # chunked by fixed:16
    assert last.queue_ms == pytest.approx(5.0)  # the idle coalescing window
    assert last.ttft_ms == pytest.approx(5.0 + backend.profile.step_ms(0, 16) + backend.profile.step_ms(0, last.prompt_total - 16))
    assert last.itl_p50_ms == pytest.approx(backend.profile.step_ms(1, 0))
    assert last.tok_s == pytest.approx(1000 / backend.profile.step_ms(1, 0))
    assert last.itl_max_ms >= last.itl_p95_ms >= last.itl_p50_ms
    assert sum(u.new_tokens for u in ups) == 12
    assert_clean(engine, "s")


def _count_tokenizations(backend, reports):
    """Record, for each chat tokenization, how many reports had been returned before it ran."""
    calls = []
    real = backend.tokenize_chat

    def spy(messages, **kw):
        calls.append(len(reports))
        return real(messages, **kw)

    backend.tokenize_chat = spy
    return calls


def test_a_long_prompt_is_reported_preparing_before_it_is_tokenized_without_an_extra_decode():
    engine, backend = engine_for(FakeBackend(n_ctx=32768), policy="fixed:64")
    reports = []

    def step():
        report = engine.step()
        reports.append(report)
        return report

    engine.submit(chat("run", "a", "hi", max_tokens=40))
    while not any(u.phase is Phase.GENERATING for r in reports for u in r.updates):
        step()
    calls = _count_tokenizations(backend, reports)
    long_text = "z" * engine.prepare_notice_chars
    engine.submit(chat("long", "b", long_text, max_tokens=3))
    notice = step()
    (u,) = [u for u in notice.updates if u.request_id == "long"]
    assert u.phase is Phase.PREPARING and u.prompt_total == 0 and u.seq_id is None
    assert notice.decode_rows == notice.prefill_rows == 0 and calls == []  # nothing ran yet
    first = step()
    assert calls == [len(reports) - 1]  # tokenized once, in the step after the notice
    (u,) = [u for u in first.updates if u.request_id == "long"]
    assert u.phase is Phase.PREFILL and u.prompt_total > len(long_text)
    assert first.decode_rows == 1 and first.prefill_rows == 64  # "run" lost no decode row to it
    # A short prompt is tokenized at once: preparing, then (whole prompt in this step, first token
    # sampled) generating, in the same report.
    engine.submit(chat("short", "c", "hello", max_tokens=3))
    ups = [u for u in step().updates if u.request_id == "short"]
    assert [u.phase for u in ups] == [Phase.PREPARING, Phase.GENERATING]
    assert ups[1].prompt_done == ups[1].prompt_total > 0 and ups[1].generated == 1
    reports += engine.run_until_idle()
    # No native decode was issued for a notice: one decode per report that ran rows.
    assert len(backend.decode_calls) == sum(1 for r in reports if r.decode_rows + r.prefill_rows)
    ups = by_request(reports)
    assert [u.phase for u in ups["long"]][:2] == [Phase.PREPARING, Phase.PREFILL]
    assert ups["long"][-1].done_reason is DoneReason.LENGTH and ups["run"][-1].generated == 40
    assert_clean(engine, "a", "b", "c")


def test_a_long_prompt_cancelled_while_preparing_is_never_tokenized():
    engine, backend = engine_for(FakeBackend(n_ctx=32768))
    reports = []
    calls = _count_tokenizations(backend, reports)
    engine.submit(chat("long", "s", "z" * 9000))
    reports.append(engine.step())
    assert [u.phase for u in reports[0].updates] == [Phase.PREPARING]
    engine.cancel("long")
    reports.append(engine.step())
    (u,) = reports[1].updates
    assert u.phase is Phase.DONE and u.done_reason is DoneReason.CANCELLED
    assert calls == [] and backend.decode_calls == []
    assert_clean(engine, "s")


def test_two_long_prompts_in_a_row_get_one_notice_then_run():
    engine, backend = engine_for(FakeBackend(n_ctx=32768), prepare_notice_chars=100)
    engine.submit(chat("a", "sa", "z" * 200, max_tokens=2))
    assert engine.step().prefill_rows == 0  # the notice for a
    # Another text: the same one would wait to copy a's prompt instead (test_engine_fork_once.py).
    engine.submit(chat("b", "sb", "y" * 200, max_tokens=2))
    report = engine.step()  # no second notice in a row: both are tokenized and scheduled
    assert report.prefill_rows > 0
    assert {u.request_id: u.phase for u in report.updates} == {"a": Phase.PREFILL, "b": Phase.PREFILL}
    assert [u.phase for u in report.updates if u.request_id == "b"] == [Phase.PREPARING, Phase.PREFILL]
    engine.run_until_idle()
    assert_clean(engine, "sa", "sb")


def test_max_tokens_and_a_full_context_end_with_length():
    engine, backend = engine_for(FakeBackend(n_ctx=4096, n_ctx_seq=64))
    engine.submit(chat("short", "a", "hi", max_tokens=5))
    engine.submit(chat("long", "b", "hi", max_tokens=1000))
    ups = by_request(engine.run_until_idle())
    assert ups["short"][-1].done_reason is DoneReason.LENGTH and ups["short"][-1].generated == 5
    long = ups["long"][-1]
    assert long.done_reason is DoneReason.LENGTH
    assert long.prompt_total + long.generated == 64
    assert_clean(engine, "a", "b")


def test_requests_with_prompt_tokens_skip_the_chat_template():
    engine, _ = engine_for(FakeBackend(eog_after=2))
    engine.submit(Request("r", "s", (), prompt_tokens=(100, 101, 102)))
    last = by_request(engine.run_until_idle())["r"][-1]
    assert last.prompt_total == 3 and last.done_reason is DoneReason.STOP
    assert_clean(engine, "s")


def test_ignore_eos_runs_the_reply_to_max_tokens_past_an_end_of_generation_token():
    # The model ends after 2 tokens; a request that ignores it keeps the end token as a token that
    # shows no text and goes on to max_tokens, as llama-server's and vLLM's ignore_eos do.
    engine, _ = engine_for(FakeBackend(eog_after=2))
    engine.submit(Request("stops", "a", (Message("user", "hi"),), SamplingParams(max_tokens=6)))
    engine.submit(Request("runs", "b", (Message("user", "hi"),), SamplingParams(max_tokens=6, ignore_eos=True)))
    ups = by_request(engine.run_until_idle())
    stops, runs = ups["stops"][-1], ups["runs"][-1]
    assert (stops.done_reason, stops.generated, text(ups["stops"])) == (DoneReason.STOP, 2, DEFAULT_REPLY[:2])
    assert (runs.done_reason, runs.generated) == (DoneReason.LENGTH, 6)
    assert text(ups["runs"]) == DEFAULT_REPLY[:2]  # what came after the end token is the end token
    assert_clean(engine, "a", "b")


def test_a_follow_up_turn_prefills_only_the_new_message():
    engine, backend = engine_for(FakeBackend(eog_after=10))
    engine.submit(chat("t1", "conv", "hello there"))
    first = by_request(engine.run_until_idle())["t1"]
    reply = text(first)
    engine.submit(chat("t2", "conv", "hello there", ("assistant", reply), "and now?"))
    reports = engine.run_until_idle()
    last = by_request(reports)["t2"][-1]
    history = len(backend.tokenize_chat([Message("user", "hello there")])) + len(reply)
    assert last.cached_tokens == history
    assert sum(r.prefill_rows for r in reports) == last.prompt_total - history
    assert_clean(engine, "conv")


def _forks(backend, n_kids=8, fork=True):
    engine, _ = engine_for(backend, policy="target:100")
    context = ("You are the lead agent. " * 60)[:1400]
    engine.submit(chat("parent", "lead", ("system", context), "plan the work", max_tokens=1))
    engine.run_until_idle()
    if not fork:  # otherwise admission would share the idle lead's prefix all the same
        engine.close_session("lead")
    t0 = backend.clock()
    for i in range(n_kids):
        # Cold: contexts that differ from their first character, or the kids would wait for the
        # first one to evaluate it and copy it (test_engine_fork_once.py).
        own = context if fork else f"{i}{context[1:]}"
        engine.submit(chat(f"kid{i}", f"kid{i}", ("system", own), "plan the work",
                           f"subtask {i}: check file {i}", max_tokens=4,
                           fork_from="lead" if fork else None))
    ups = by_request(engine.run_until_idle())
    kids = [ups[f"kid{i}"][-1] for i in range(n_kids)]
    assert_clean(engine, *(["lead"] if fork else []), *(f"kid{i}" for i in range(n_kids)))
    return kids, t0


def test_forked_subagents_reuse_the_parent_prefix_and_start_far_sooner():
    forked, _ = _forks(SimulatedBackend("cpu2core", n_ctx=16384, n_batch=512))
    cold, _ = _forks(SimulatedBackend("cpu2core", n_ctx=16384, n_batch=512), fork=False)
    assert all(k.cached_tokens >= 1000 for k in forked)
    assert all(k.cached_tokens == 0 for k in cold)
    assert all(k.done_reason is DoneReason.LENGTH for k in forked + cold)
    # Cold prompts are served shortest first, so the first cold one starts after one prompt's
    # prefill; the typical one waits for several.
    assert max(k.ttft_ms for k in forked) * 5 < sorted(k.ttft_ms for k in cold)[len(cold) // 2]
    assert [text([k]) for k in forked] == [text([k]) for k in cold]


def test_cancel_mid_prefill_ends_within_one_step_and_keeps_the_committed_prompt_rows():
    engine, backend = engine_for(policy="fixed:16")
    engine.submit(chat("keep", "k", "hi", max_tokens=50))
    engine.submit(chat("gone", "g", "x" * 300))
    engine.step()
    engine.step()
    slot = engine.scheduler.sessions["g"].seq_id
    done = backend.kv_pos_max(slot) + 1
    assert done > 0
    engine.cancel("gone")
    report = engine.step()
    (u,) = [u for u in report.updates if u.request_id == "gone"]
    assert u.phase is Phase.DONE and u.done_reason is DoneReason.CANCELLED
    assert slot not in {s.seq_id for s in report_plan(backend)} and slot not in backend.samplers
    prompt = backend.tokenize_chat([Message("user", "x" * 300)])
    assert u.prompt_done == done and backend.kv_tokens(slot) == prompt[:done]
    assert engine.scheduler.sessions["g"].is_idle
    # Sent again, the prompt starts from the rows that were already evaluated.
    engine.submit(chat("again", "g", "x" * 300, max_tokens=2))
    again = by_request(engine.run_until_idle())["again"][-1]
    assert again.cached_tokens == done and again.done_reason is DoneReason.LENGTH
    engine.cancel("keep")
    assert_clean(engine, "k", "g")


def test_the_turn_after_a_cancelled_reply_reuses_its_committed_kv():
    engine, backend = engine_for(FakeBackend(eog_after=None))
    engine.submit(chat("t1", "conv", "hello there", max_tokens=100))
    reports = []
    while sum(u.new_tokens for r in reports for u in r.updates) < 8:
        reports.append(engine.step())
    engine.cancel("t1")
    reports += engine.run_until_idle()
    ups = by_request(reports)["t1"]
    assert ups[-1].done_reason is DoneReason.CANCELLED
    shown = text(ups)
    prompt = backend.tokenize_chat([Message("user", "hello there")])
    slot = engine.scheduler.sessions["conv"].seq_id
    # The KV keeps the prompt and every shown token but the last, which was never evaluated.
    committed = prompt + [ord(c) for c in shown[:-1]]
    assert len(shown) == ups[-1].generated == 8 and backend.kv_tokens(slot) == committed
    engine.submit(chat("t2", "conv", "hello there", ("assistant", shown), "go on", max_tokens=3))
    reports = engine.run_until_idle()
    last = by_request(reports)["t2"][-1]
    assert last.cached_tokens == len(committed) > 0
    assert sum(r.prefill_rows for r in reports) == last.prompt_total - len(committed)
    assert_clean(engine, "conv")


def report_plan(backend):
    return backend.decode_calls[-1].slices


def test_a_cancel_that_arrives_during_decode_is_honoured_before_sampling():
    engine, backend = engine_for()
    engine.submit(chat("r", "s", "hi"))
    engine.step()
    backend.fault_when = lambda plan: engine.cancel("r")  # arrives while the step runs
    report = engine.step()
    (u,) = report.updates
    assert u.done_reason is DoneReason.CANCELLED and u.text_delta == "" and u.new_tokens == 0
    assert backend.samplers == {}
    # The step's row (the first sampled token) was evaluated but never committed: not kept.
    prompt = backend.tokenize_chat([Message("user", "hi")])
    assert u.generated == 1 and backend.kv_tokens(u.seq_id) == prompt
    assert backend.kv_cells_used() == len(prompt)
    backend.fault_when = None
    assert_clean(engine, "s")


def test_a_submit_and_its_cancel_arriving_during_decode_never_run():
    engine, backend = engine_for()
    engine.submit(chat("a", "sa", "hi", max_tokens=3))
    engine.step()

    def during_decode(plan):
        backend.fault_when = None
        engine.submit(chat("b", "sb", "hello"))
        engine.cancel("b")

    backend.fault_when = during_decode
    ups = by_request(engine.run_until_idle())
    # b was taken in (reported preparing) and cancelled in the same step, before any row ran.
    assert [(u.phase, u.done_reason) for u in ups["b"]] == [(Phase.PREPARING, None),
                                                           (Phase.DONE, DoneReason.CANCELLED)]
    assert all(u.prompt_done == 0 and u.generated == 0 for u in ups["b"])
    assert ups["a"][-1].done_reason is DoneReason.LENGTH
    assert all(len(p.slices) == 1 for p in backend.decode_calls)
    assert_clean(engine, "sa")


def test_cancel_while_queued_and_close_session():
    engine, _ = engine_for(FakeBackend(n_seq_max=1))
    engine.submit(chat("a", "sa", "hi", max_tokens=100))
    engine.submit(chat("b", "sb", "hi"))
    engine.step()
    ups = by_request([engine.step()])
    assert "b" not in ups or ups["b"][-1].phase is Phase.QUEUED
    engine.cancel("b")
    engine.close_session("sa")
    ups = by_request([engine.step()])
    assert ups["b"][-1].done_reason is DoneReason.CANCELLED and ups["b"][-1].ttft_ms is None
    assert ups["a"][-1].done_reason is DoneReason.CANCELLED
    assert_clean(engine)


def test_idle_coalescing_admits_a_burst_in_one_batch():
    clock = VirtualClock()
    engine, backend = engine_for(FakeBackend(), coalesce_ms=5, clock=clock)
    engine.submit(chat("a", "sa", "hi"))
    assert engine.step().prefill_rows == 0
    clock.advance(0.002)
    engine.submit(chat("b", "sb", "hi"))
    assert engine.step().prefill_rows == 0
    clock.advance(0.002)
    assert engine.step() is None and engine.wait_hint() == pytest.approx(0.001)
    clock.advance(0.001)
    report = engine.step()
    assert {u.request_id for u in report.updates} == {"a", "b"}
    assert len(backend.decode_calls[0].slices) == 2
    engine.cancel("a")
    engine.cancel("b")
    assert_clean(engine, "sa", "sb")


def test_idle_conversations_keep_their_slot_until_evicted_least_recently_used():
    engine, backend = engine_for(FakeBackend(n_seq_max=2, eog_after=3))
    for rid, sid in (("a1", "A"), ("b1", "B")):
        engine.submit(chat(rid, sid, "hi"))
        engine.run_until_idle()
    slot_b = engine.scheduler.sessions["B"].seq_id
    engine.submit(chat("a2", "A", "hi", ("assistant", "The"), "more"))
    assert by_request(engine.run_until_idle())["a2"][-1].cached_tokens > 0
    engine.submit(chat("c1", "C", "hi"))
    c = by_request(engine.run_until_idle())["c1"][-1]
    assert c.seq_id == slot_b and "B" not in engine.scheduler.sessions
    assert set(engine.scheduler.sessions) == {"A", "C"}
    assert_clean(engine, "A", "C")


def test_policy_can_change_between_steps_and_bad_ones_are_refused():
    engine, _ = engine_for(policy="target:50")
    engine.set_policy("fixed:8")
    assert engine.policy == "fixed:8"
    with pytest.raises(ValueError, match="prefill-first"):
        engine.set_policy("fast please")
    assert engine.policy == "fixed:8"
    engine.submit(chat("r", "s", "hello world", max_tokens=2))
    report = engine.step()
    assert report.policy == "fixed:8" and report.prefill_rows == 8 and report.budget == 8
    assert report.kv_used == 8 and report.kv_total == 4096 and report.running == 1
    assert_clean(engine, "s")


def test_commands_from_other_threads_while_the_loop_runs():
    engine = Engine(FakeBackend(n_seq_max=4, eog_after=5), policy="target:20", coalesce_ms=1)
    done = {}

    def client():
        for i in range(20):
            engine.submit(chat(f"r{i}", f"s{i}", f"task {i}"))
            time.sleep(0.001)

    t = threading.Thread(target=client)
    t.start()
    deadline = time.monotonic() + 20
    while (t.is_alive() or engine.has_work()) and time.monotonic() < deadline:
        report = engine.step()
        for u in report.updates if report else ():
            if u.phase is Phase.DONE:
                done[u.request_id] = u.done_reason
        if report is None:
            time.sleep(engine.wait_hint() or 0.0005)
    t.join()
    assert done == {f"r{i}": DoneReason.STOP for i in range(20)}
    assert_clean(engine, *(f"s{i}" for i in range(20)))


def test_a_parent_whose_subagents_still_run_is_evicted_after_an_idle_conversation_that_is_not():
    # Three slots. The lead answers first, then O; a subagent forks from the lead and keeps
    # running. A newcomer needs a slot: plain LRU would drop the lead (the older), whose subagent's
    # answer is about to extend it; O goes instead.
    engine, backend = engine_for(FakeBackend(n_seq_max=3, eog_after=3))
    engine.submit(chat("lead1", "lead", ("system", "You are the lead agent. " * 20), "plan"))
    engine.run_until_idle()
    engine.submit(chat("o1", "O", "hi"))
    engine.run_until_idle()
    backend.eog_after = None  # the subagent runs until it is cancelled
    engine.submit(chat("sub1", "sub", ("system", "You are the lead agent. " * 20), "plan",
                       ("assistant", "ok"), "check a file", max_tokens=10_000, fork_from="lead"))
    for _ in range(3):
        engine.step()
    assert engine.scheduler.sessions["sub"].live is not None
    engine.submit(chat("n1", "N", "hello"))
    for _ in range(3):
        engine.step()
    assert set(engine.scheduler.sessions) == {"lead", "sub", "N"}
    engine.cancel("sub1")
    engine.cancel("n1")
    engine.run_until_idle()
