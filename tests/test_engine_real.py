"""The engine on the real model (CPU): admission under policies, fork, follow-up turns, bad requests."""

from __future__ import annotations

import pytest

from magnitude_bench.common import Contention, wait_for_quiet
from magnitude_tui.engine.core import Engine
from scheduler.types import DoneReason, Message
from tests.engine_driver import Driver, close_and_assert_empty

pytestmark = pytest.mark.slow

STORY = "Write a very long story about a dragon who learns to bake bread."


def long_text(n_facts: int) -> str:
    return " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(n_facts))


def admission_run(backend, policy: str, newcomer_tokens: list[int]):
    """4 sequences generate; then one long prompt arrives. Returns the running sequences' max
    inter-token gap during the admission window, the newcomer's TTFT and the window length."""
    engine = Engine(backend, policy=policy)
    engine.calibrate()
    d = Driver(engine)
    running = [d.submit(f"run{i}", f"r{i}", f"{STORY} Chapter {i + 1}.", max_tokens=300) for i in range(4)]
    d.run_until(lambda: all(len(d.seen[r].token_times) >= 3 for r in running))
    t_arrive = engine._clock()
    d.submit("new", "newcomer", prompt_tokens=newcomer_tokens, max_tokens=4)
    d.run_until(lambda: d.seen["new"].token_times or d.seen["new"].done)
    t_first = d.seen["new"].token_times[0]
    # One more token for every running sequence, so a stall that spans the whole window is seen.
    d.run_until(lambda: all(d.seen[r].done or d.seen[r].token_times[-1] > t_first for r in running))
    gaps = {r: d.seen[r].gaps_ms(t_arrive, t_first) for r in running}
    alive = {r: g for r, g in gaps.items() if g and d.seen[r].token_times[-1] > t_first}
    for r in running:
        engine.cancel(r)
    d.run_until_done("new", *running)
    close_and_assert_empty(engine, "newcomer", *(f"r{i}" for i in range(4)))
    steps = [r for r in d.reports if r.t >= t_arrive and r.t <= t_first and r.prefill_rows]
    return {
        "max_gap_ms": max(max(g) for g in alive.values()),
        "p50_gap_ms": _pct([x for g in alive.values() for x in g], 0.5),
        "p90_gap_ms": _pct([x for g in alive.values() for x in g], 0.9),
        "ttft_ms": d.seen["new"].updates[-1].ttft_ms,
        "window_ms": (t_first - t_arrive) * 1000,
        "running_alive": len(alive),
        "steps": len(steps),
        "budget": max((r.budget for r in steps), default=0),
    }


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


@pytest.mark.serial
def test_target_policy_bounds_running_gaps_while_prefill_first_freezes_them(clean_llama):
    b = clean_llama
    newcomer = b.tokenize_chat([Message("user", long_text(90) + " Which fact mentions 49?")])
    assert len(newcomer) >= 1500, len(newcomer)
    target_ms = 200
    # Inter-token gaps are wall-clock figures: another process taking a core makes ggml's spinning
    # threads many times slower. Run on a quiet machine, and again if a neighbour got busy.
    for attempt in range(3):
        wait_for_quiet(max_wait_s=120)
        busy = Contention()
        tgt = admission_run(b, f"target:{target_ms}", newcomer)
        pf = admission_run(b, "prefill-first", newcomer)
        others = busy.others_cores()
        if others <= 0.25:
            break
    print(f"\nnewcomer prompt: {len(newcomer)} tokens; 4 sequences generating; other processes used "
          f"{others:.2f} cores meanwhile (attempt {attempt + 1})")
    for name, r in (("target:%d" % target_ms, tgt), ("prefill-first", pf)):
        print(f"{name:>14}: running max ITL {r['max_gap_ms']:.0f} ms, p50 {r['p50_gap_ms']:.0f} ms, "
              f"p90 {r['p90_gap_ms']:.0f} ms, "
              f"newcomer TTFT {r['ttft_ms']:.0f} ms, {r['steps']} prefill steps (budget {r['budget']}), "
              f"{r['running_alive']}/4 running through the window")
    assert tgt["running_alive"] >= 3 and pf["running_alive"] >= 3
    # Under the target policy running sequences get a token every ~target ms, never more than
    # ~2x. On a quiet machine that holds for the max; when another process takes a core, a step of
    # the same planned shape can take 5x longer (ggml's spin barriers), so the bound that must
    # hold whatever the machine does is on p90, and the max is printed above.
    assert tgt["p90_gap_ms"] <= 2 * target_ms, tgt
    assert tgt["steps"] >= 5  # ... because the prompt really was split across many steps
    # ... while prefill-first runs the prompt in prompt-only steps (as many as n_batch forces)
    # and everyone waits for all of it.
    assert pf["steps"] == -(-len(newcomer) // b.n_batch)
    assert pf["max_gap_ms"] >= 0.8 * pf["window_ms"]
    assert pf["max_gap_ms"] > 3 * tgt["p90_gap_ms"]


def test_follow_up_turn_prefills_only_the_new_message(clean_llama):
    engine = Engine(clean_llama, policy="target:100")
    engine.calibrate()
    d = Driver(engine)
    first = [Message("user", long_text(30) + " Which fact mentions 9?")]
    d.submit("t1", "conv", first, max_tokens=16)
    d.run_until_done("t1")
    t1 = d.seen["t1"].last
    assert t1.cached_tokens == 0
    follow = first + [Message("assistant", d.seen["t1"].text), Message("user", "And which mentions 16?")]
    d.submit("t2", "conv", follow, max_tokens=8)
    d.run_until_done("t2")
    t2 = d.seen["t2"].last
    new_msg = len(clean_llama.tokenize("And which mentions 16?"))
    print(f"\nturn 1: {t1.prompt_total} prompt tokens; turn 2: {t2.prompt_total} prompt tokens, "
          f"{t2.cached_tokens} cached, {t2.prompt_total - t2.cached_tokens} prefilled")
    assert t2.cached_tokens >= t1.prompt_total
    # Only the new user message plus its template scaffolding (and at most the reply's last
    # tokens, where re-tokenizing the reply differs from the sampled tokens) are prefilled.
    assert t2.prompt_total - t2.cached_tokens <= new_msg + 16
    close_and_assert_empty(engine, "conv")


FORKS = 4  # a burst of subagents (bench agents runs bursts of 3-6 at full length)


@pytest.mark.serial
def test_forked_subagents_reuse_the_parent_prefix(clean_llama):
    b = clean_llama
    engine = Engine(b, policy="target:200")
    engine.calibrate()
    d = Driver(engine)
    parent = [Message("user", long_text(60) + " Summarise these facts in one sentence.")]
    d.submit("p", "parent", parent, max_tokens=8)
    d.run_until_done("p")
    assert d.seen["p"].last.prompt_total >= 1000
    history = parent + [Message("assistant", d.seen["p"].text)]
    tasks = [f"Subtask {i}: which fact mentions {i * i}?" for i in range(FORKS)]
    forks = [d.submit(f"f{i}", f"child{i}", history + [Message("user", t)], max_tokens=2, fork_from="parent")
             for i, t in enumerate(tasks)]
    d.run_until_done(*forks, timeout=600)
    cached = [d.seen[r].last.cached_tokens for r in forks]
    # Admission shares any idle conversation's prefix, so the cold runs need the forks gone.
    for s in ["parent"] + [f"child{i}" for i in range(FORKS)]:
        engine.close_session(s)
    d.run_until(lambda: not engine.has_work())
    # The same prompts, each opened by its own system line so that no two share a prefix: the
    # first colds would otherwise lend theirs to the ones admitted after them.
    colds = [d.submit(f"c{i}", f"cold{i}", [Message("system", f"Run {i}.")] + history + [Message("user", t)],
                      max_tokens=2)
             for i, t in enumerate(tasks)]
    d.run_until_done(*colds, timeout=900)
    fork_ttft = [d.seen[r].last.ttft_ms for r in forks]
    cold_ttft = [d.seen[r].last.ttft_ms for r in colds]
    print(f"\nparent context {d.seen['p'].last.prompt_total} tokens; forked cached {min(cached)}..{max(cached)}")
    print(f"{FORKS} forked: TTFT max {max(fork_ttft):.0f} ms; {FORKS} cold: TTFT max {max(cold_ttft):.0f} ms "
          f"(ratio {max(cold_ttft) / max(fork_ttft):.1f}x)")
    assert all(c >= 1000 for c in cached), cached
    assert all(d.seen[r].last.cached_tokens == 0 for r in colds)
    assert all(d.seen[r].last.error is None for r in forks + colds)
    assert max(fork_ttft) * 3 < max(cold_ttft)
    close_and_assert_empty(engine, *(f"cold{i}" for i in range(FORKS)))


def test_bad_requests_fail_alone_and_the_rest_carry_on(clean_llama):
    b = clean_llama
    engine = Engine(b, policy="target:100")
    engine.calibrate()
    d = Driver(engine)
    d.submit("good", "g", "What is the capital of France? Answer in one word.", max_tokens=8)
    d.submit("huge", "h", prompt_tokens=[42] * (b.n_ctx + 10), max_tokens=4)
    d.submit("vocab", "v", prompt_tokens=[b.n_vocab + 7], max_tokens=4)
    d.submit("empty", "e", prompt_tokens=[], max_tokens=4)
    d.run_until_done("good", "huge", "vocab", "empty")
    for rid in ("huge", "vocab", "empty"):
        last = d.seen[rid].last
        print(f"\n{rid}: {last.error}")
        assert last.done_reason is DoneReason.ERROR and last.error
    assert d.seen["good"].last.done_reason in (DoneReason.STOP, DoneReason.LENGTH)
    assert "Paris" in d.seen["good"].text
    close_and_assert_empty(engine, *"ghve")
