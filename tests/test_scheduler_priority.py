"""Priority classes in the planner: a person's turn first, then agents, then background work
(admission, prompt rows, and which sequence KV pressure preempts)."""

from __future__ import annotations

from dataclasses import replace

from scheduler.budget import IDLE_MERGE_MS, MIN_PREFILL_QUANTUM
from scheduler.cost_model import CostParams
from scheduler.types import DoneReason, Phase, Priority
from tests.planner_driver import add, close_all, make, rows, step


def _with_priority(seq, priority):
    seq.request = replace(seq.request, priority=priority)
    return seq


def _two_agents_decoding(sched, kv, prompt_len: int) -> list:
    """Two AGENT-class sequences of `prompt_len` prompt tokens, stepped until both decode."""
    agents = [_with_priority(add(sched, f"agent{i}", prompt_len), Priority.AGENT) for i in range(2)]
    while not all(a.is_decoding for a in agents):
        step(sched, kv)
    return agents


def test_admission_takes_the_highest_class_first_and_is_fifo_within_it():
    sched, kv = make(n_seq_max=1)
    blocker = add(sched, "blocker", 8, max_tokens=2)
    step(sched, kv)
    bg = _with_priority(add(sched, "bg", 8, max_tokens=1), Priority.BACKGROUND)
    a1 = _with_priority(add(sched, "a1", 8, max_tokens=1), Priority.AGENT)
    a2 = _with_priority(add(sched, "a2", 8, max_tokens=1), Priority.AGENT)
    while sched.has_work():
        step(sched, kv)
    order = [s.request_id for s in sorted((bg, a1, a2), key=lambda s: s.admit_order)]
    assert order == ["a1", "a2", "bg"] and blocker.is_finished
    close_all(sched)


def test_a_persons_turn_never_waits_behind_agents_for_a_slot():
    sched, kv = make(n_seq_max=2)
    agents = _two_agents_decoding(sched, kv, 8)
    person = add(sched, "person", 8)  # INTERACTIVE by default
    plan = step(sched, kv)
    assert person.seq_id is not None and person.seq_id in rows(plan)
    newest = max(agents, key=lambda a: a.admit_order)
    assert newest.phase is Phase.QUEUED and newest.num_preemptions == 1
    while not person.is_finished and sched.has_work():
        step(sched, kv, finish_at=3)
        if person.num_tokens - len(person.prompt) >= 3:
            sched.finish(person, DoneReason.STOP)
    sched.close_session(person.session_id)
    for _ in range(50):  # the preempted agent comes back and recomputes
        if newest.is_decoding:
            break
        step(sched, kv)
    assert newest.is_decoding
    close_all(sched)


def test_prompt_rows_go_to_the_higher_class_first():
    sched, kv = make("fixed:32")
    _with_priority(add(sched, "agent", 200), Priority.AGENT)
    person = add(sched, "person", 200)
    plan = step(sched, kv)
    assert rows(plan) == {person.seq_id: 32}
    close_all(sched)


def test_kv_pressure_preempts_the_lowest_class_first():
    sched, kv = make("fixed:64", n_ctx=300, gen_reserve=8)
    person = add(sched, "person", 100)
    agent = _with_priority(add(sched, "agent", 100), Priority.AGENT)
    newest = add(sched, "person2", 60)
    while not (person.is_decoding and agent.is_decoding and newest.is_decoding):
        step(sched, kv)
    for _ in range(60):
        step(sched, kv)
        if agent.num_preemptions or person.num_preemptions or newest.num_preemptions:
            break
    assert agent.num_preemptions == 1 and person.num_preemptions == 0 and newest.num_preemptions == 0
    close_all(sched)


def test_a_persons_turn_never_waits_behind_agents_for_kv_room():
    # Slots are free but the agents' prompts and reserves hold the cache: the person's turn takes
    # the room of the newest agent instead of waiting for an agent's reply to end.
    sched, kv = make("fixed:64", n_ctx=400, n_seq_max=8, gen_reserve=32)
    agents = _two_agents_decoding(sched, kv, 150)
    person = add(sched, "person", 60)
    plan = step(sched, kv)
    assert person.seq_id is not None and person.seq_id in rows(plan)
    newest = max(agents, key=lambda a: a.admit_order)
    oldest = min(agents, key=lambda a: a.admit_order)
    assert newest.phase is Phase.QUEUED and newest.num_preemptions == 1 and oldest.num_preemptions == 0
    close_all(sched)


def test_an_agent_waits_its_turn_behind_agents_and_preempts_nobody():
    # Making way is only for a higher class: within a class the queue is first come, first served.
    sched, kv = make("fixed:64", n_ctx=400, n_seq_max=8, gen_reserve=32)
    agents = _two_agents_decoding(sched, kv, 150)
    late = _with_priority(add(sched, "late", 60), Priority.AGENT)
    step(sched, kv)
    assert late.seq_id is None and late.phase is Phase.QUEUED and "KV room" in late.waiting_reason
    assert all(a.num_preemptions == 0 for a in agents)
    close_all(sched)


def test_with_no_person_waiting_an_agents_prompt_takes_an_idle_steps_worth_beside_decode_rows():
    # A slow CPU: two decode rows take 40 ms and a prompt row 5 ms, so target:50 is out of reach.
    # A person's decode row keeps its cadence: the newcomer gets the 16-row floor. With only
    # agents decoding nobody reads tokens as they come: the newcomer gets what fits in
    # IDLE_MERGE_MS and never under one micro-batch, as a llama-server batch would take it, and
    # the decode rows keep their row.
    cost = CostParams(fixed_ms=30.0, decode_ms=5.0, prefill_ms=5.0)
    granted = {}
    for classes in ((Priority.INTERACTIVE, Priority.INTERACTIVE), (Priority.AGENT, Priority.INTERACTIVE),
                    (Priority.AGENT, Priority.AGENT), (Priority.BACKGROUND, Priority.AGENT)):
        sched, kv = make("target:50", n_batch=2048)
        sched.cost.seed(cost)
        decoders = [_with_priority(add(sched, f"d{i}", 8), who) for i, who in enumerate(classes)]
        while not all(d.is_decoding for d in decoders):
            step(sched, kv)
        newcomer = _with_priority(add(sched, "tool-result", 1500), Priority.AGENT)
        plan = step(sched, kv)
        assert all(rows(plan)[d.seq_id] == 1 for d in decoders)
        granted[classes] = rows(plan)[newcomer.seq_id]
        close_all(sched)
    idle_worth = int((IDLE_MERGE_MS - cost.predict(2, 0)) / cost.prefill_ms)  # 392 rows
    assert idle_worth < 512
    assert granted == {(Priority.INTERACTIVE, Priority.INTERACTIVE): MIN_PREFILL_QUANTUM,
                       (Priority.AGENT, Priority.INTERACTIVE): MIN_PREFILL_QUANTUM,
                       (Priority.AGENT, Priority.AGENT): 512,  # one micro-batch
                       (Priority.BACKGROUND, Priority.AGENT): 512}
