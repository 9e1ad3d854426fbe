"""Tests `bench agents`: the seeded trace, and the accounting of prompt tokens on a short replay (fake backend)."""

from __future__ import annotations

import json

import pytest

from magnitude_bench.agents import AgentsConfig, run_agents
from magnitude_bench.agents_replay import CallKind, CallRecord
from magnitude_bench.agents_report import account, minimum_new
from magnitude_bench.agents_trace import (
    CHARS_PER_TOKEN,
    HISTORY_BUDGET,
    Trace,
    default_trace_path,
    generate,
    load_trace,
)

FILES = {f"src/f{i}.py": "".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(400)) for i in range(3)}


def test_trace_is_seeded_and_its_first_agents_are_the_smaller_trace():
    big = generate(FILES, seed=5, agents=16, turns=6)
    assert generate(FILES, seed=5, agents=16, turns=6) == big
    assert generate(FILES, seed=5, agents=4, turns=6).agents == big.agents[:4]
    assert generate(FILES, seed=6, agents=16, turns=6) != big
    assert Trace.from_json(big.to_json()) == big


def test_trace_draws_stay_in_the_issue_ranges():
    t = generate(FILES, seed=1, agents=16, turns=6)
    reads = [x for a in t.agents for x in a.turns if not x.is_burst]
    bursts = [x for a in t.agents for x in a.turns if x.is_burst]
    assert reads and bursts
    assert all(100 * CHARS_PER_TOKEN <= x.chars <= 3000 * CHARS_PER_TOKEN for x in reads)
    assert all(0.0 <= x.think_s <= 2.0 for x in reads)
    assert all(40 <= x.max_tokens <= 150 for a in t.agents for x in a.turns)
    assert all(3 <= len(b.subtasks) <= 6 and len({s.task for s in b.subtasks}) == len(b.subtasks) for b in bursts)
    for a in t.agents:  # an agent's history stays within the model's context
        est = sum(x.chars / CHARS_PER_TOKEN + x.max_tokens for x in a.turns)
        assert est <= HISTORY_BUDGET
    assert not any(x.is_burst for a in generate(FILES, seed=1, bursts=False).agents for x in a.turns)


@pytest.mark.parametrize("bursts", [True, False])
def test_the_repository_traces_regenerate_from_their_stored_files(bursts):
    stored = load_trace(default_trace_path(bursts))
    assert len(stored.agents) == 16
    assert generate(stored.files, seed=stored.seed, bursts=bursts) == stored


def _call(i, prompt, evaluated, completion=50, extends=None, by_length=False):
    return CallRecord(i, 0, "c", CallKind.TURN, i, extends, prompt_tokens=prompt, evaluated=evaluated,
                      completion_tokens=completion, by_length=by_length)


def test_minimum_counts_new_tokens_only():
    first = _call(0, 300, 300)
    assert minimum_new(first, None) == 300
    # The next call extends prompt + reply; a reply cut at max_tokens leaves its last token unevaluated.
    assert minimum_new(_call(1, 500, 0), first) == 150
    assert minimum_new(_call(1, 500, 0), _call(0, 300, 300, by_length=True)) == 151


def test_accounting_counts_what_was_evaluated_beyond_the_minimum():
    calls = [_call(0, 300, 300), _call(1, 500, 150, extends=0), _call(2, 800, 800, completion=20, extends=1)]
    acc = account(calls)
    assert (acc.prompt, acc.minimum, acc.evaluated) == (1600, 300 + 150 + 250, 1250)
    assert acc.reevaluated == 800 - 250  # the third call found nothing cached: its history again
    calls[2].error = "HTTP 500"  # a failed call counts for nothing
    assert account(calls).minimum == 450


def _replay_config(tmp_path, **kw) -> AgentsConfig:
    trace = generate(FILES, seed=3, agents=3, turns=3, k_range=(20, 60), reply_range=(8, 16), think_range=(0, 0.05))
    path = tmp_path / "trace.json"
    path.write_text(trace.to_json())
    return AgentsConfig(**{"trace": str(path), "agents": 3, "turns": 3, "k_max": None, "sides": ("serve", "engine"),
                           "reps": 1, "backend": "fake", "in_process": True, **kw})


def test_short_replay_evaluates_no_more_than_the_minimum_while_the_context_has_room(tmp_path):
    # Room in the context and in the slots: a slot for every conversation the trace can hold at
    # once (its agents and every subagent), so no idle one is evicted for a slot. With fewer slots
    # two bursts that overlap (the think times decide) evict an agent waiting on its subagents.
    trace = load_trace(_replay_config(tmp_path).trace)
    slots = len(trace.agents) + sum(len(t.subtasks) for a in trace.agents for t in a.turns)
    cfg = _replay_config(tmp_path, n_ctx=16384, parallel=slots)
    result = run_agents(cfg, argv=["test"])
    runs = result.data["runs"]
    assert [r["side"] for r in runs] == ["serve", "engine"]
    assert not any("did not run" in n for n in result.notes)
    trace = load_trace(cfg.trace)
    calls = len(trace.agents) + sum(1 + len(t.subtasks) for a in trace.agents for t in a.turns)
    for r in runs:
        assert r["errors"] == 0 and r["calls"] == calls and r["makespan_s"] > 0
        assert r["reevaluated"] == 0, r["side"]
        # Subagents forked together may share a few task tokens with each other too.
        assert 0.95 * r["minimum"] <= r["evaluated"] <= r["minimum"]
        assert r["kv"] and r["ttft_p95_s"] is not None
    assert result.tables["the issue's targets"][0]["met"]  # serve: evaluated <= 1.1x the minimum


def test_unknown_side_is_refused():
    with pytest.raises(ValueError, match="unknown side"):
        AgentsConfig(sides=("serve", "vllm"))
    with pytest.raises(ValueError, match="exactly two sides"):
        AgentsConfig(sides=("serve", "llama-server", "engine"), paired=True)


@pytest.mark.serial
def test_paired_sides_replay_at_the_same_time_on_cores_swapped_every_repetition(tmp_path):
    import os

    before = os.sched_getaffinity(0)
    result = run_agents(_replay_config(tmp_path, reps=2, paired=True), argv=["test"])
    assert os.sched_getaffinity(0) == before  # this process is given its cores back
    runs = result.data["runs"]
    assert not any("did not run" in n for n in result.notes)
    assert [(r["rep"], r["side"]) for r in runs] == [(1, "serve"), (1, "engine"), (2, "serve"), (2, "engine")]
    for rep in (1, 2):
        a, b = (r for r in runs if r["rep"] == rep)
        assert a["errors"] == b["errors"] == 0 and a["calls"] == b["calls"]
        assert a["core"] != b["core"] and (a["paired_with"], b["paired_with"]) == ("engine", "serve")
        # At once: each side's first call went out before the other side's last reply ended.
        span = [(min(c["t_send"] for c in r["call_log"]), max(c["t_end"] for c in r["call_log"])) for r in (a, b)]
        assert span[0][0] < span[1][1] and span[1][0] < span[0][1]
    assert runs[0]["core"] == runs[3]["core"] != runs[2]["core"]  # swapped in the second repetition
    assert any(n.startswith("paired:") for n in result.notes)


def test_short_replay_counts_what_an_eviction_makes_it_evaluate_again(tmp_path, monkeypatch):
    # The agents' final histories hold about 6,000 tokens together: a 3,200-cell context must drop
    # some history that a later turn needs again, and the accounting must see it. (With the
    # host-memory tier on, the engine restores what it dropped instead: the tier is off here.)
    from scheduler.ram_tier import RamTier

    monkeypatch.setattr(RamTier, "wants", lambda self, tokens: False)
    result = run_agents(_replay_config(tmp_path, n_ctx=3200), argv=["test"])
    for r in result.data["runs"]:
        assert r["errors"] == 0
        assert r["reevaluated"] > 0 and r["evaluated"] > r["minimum"], r["side"]


HISTORY = [{"role": "system", "content": "You are agent 0."}, {"role": "user", "content": "Explain the planner."},
           {"role": "assistant", "content": "I will delegate.", "tool_calls": [
               {"id": f"call_{i}", "type": "function",
                "function": {"name": "spawn_subagent", "arguments": '{"task": "Check file %d."}' % i}} for i in range(2)]},
           {"role": "tool", "tool_call_id": "call_0", "content": "Yes, it is tested."},
           {"role": "tool", "tool_call_id": "call_1", "content": "No test."}]


@pytest.mark.slow
def test_the_side_on_serves_prompts_gets_the_very_tokens_serve_evaluates(llama):
    """llama-server's own rendering drops the calls; this side is sent serve's rendering instead,
    as plain turns any template renders, so both sides evaluate the same prompt."""
    from magnitude_bench.agents_sides import as_serve_renders, to_messages

    plain = as_serve_renders(HISTORY)
    assert {m["role"] for m in plain} <= {"system", "user", "assistant"} and all(set(m) == {"role", "content"}
                                                                                 for m in plain)
    assert "Check file 1." in plain[2]["content"] and "No test." in plain[-1]["content"]
    assert llama.tokenize_chat(to_messages(plain)) == llama.tokenize_chat(to_messages(HISTORY))


def test_the_side_on_serves_prompts_is_reported_apart_and_never_taken_for_llama_servers_best():
    from magnitude_bench.agents_report import _ratios
    from magnitude_bench.agents_sides import SIDES

    alike = SIDES["llama-server+serve-prompts"].label

    def run(side, makespan):
        return {"bursts": True, "rep": 0, "errors": 0, "side": side, "makespan_s": makespan,
                "ttft_p95_s": 1.0, "ttft_p50_s": 1.0}

    got = _ratios([run("serve", 80.0), run("llama-server", 130.0), run(alike, 100.0)], bursts=True)
    assert got is not None
    assert got["makespan ÷ best"] == round(80 / 130, 3) and got["best llama-server (by makespan)"] == "llama-server"
    assert got[f"makespan ÷ {alike}"] == round(80 / 100, 3)


def test_either_side_on_an_attention_path_asked_for_is_reported_as_what_it_is():
    from magnitude_bench.agents_report import _ratios
    from magnitude_bench.agents_sides import SIDES

    dense = SIDES["llama-server+fa-off"]
    assert dense.label == "llama-server -fa off" and dense.server_args()[-2:] == ["-fa", "off"]
    assert "-fa" not in SIDES["llama-server"].server_args()
    assert "llama-server+fa-off" not in AgentsConfig().sides  # run when asked for by name

    def run(side, makespan):
        return {"bursts": True, "rep": 0, "errors": 0, "side": side, "makespan_s": makespan,
                "ttft_p95_s": 1.0, "ttft_p50_s": 1.0}

    flash_serve = SIDES["serve+fa-on"]
    assert flash_serve.label == "serve -fa on" and "serve+fa-on" not in AgentsConfig().sides
    assert SIDES["serve+spec-off"].label == "serve --spec off" and "serve+spec-off" not in AgentsConfig().sides
    got = _ratios([run("serve", 80.0), run("llama-server", 130.0), run(dense.label, 100.0),
                   run(flash_serve.label, 60.0)], bursts=True)
    assert got is not None  # serve on a path asked for is neither serve as launched nor llama-server
    assert got["makespan ÷ best"] == 0.8 and got["best llama-server (by makespan)"] == dense.label


def test_the_stream_sides_are_measured_as_what_they_are():
    """serve --kv-streams carries the targets only where plain serve is not a side; llama-server
    -no-kvu is outside the issue's configurations: a column of its own, never their best."""
    from magnitude_bench.agents_report import _ratios, _targets
    from magnitude_bench.agents_sides import SIDES

    streams_serve, streams_peer = SIDES["serve+streams"], SIDES["llama-server+streams"]
    assert streams_serve.label == "serve --kv-streams" and streams_peer.label == "llama-server -no-kvu"
    assert streams_peer.server_args() == ["-no-kvu"] and "-no-kvu" not in SIDES["llama-server"].server_args()
    assert not {"serve+streams", "llama-server+streams"} & set(AgentsConfig().sides)

    def run(side, makespan):
        return {"bursts": False, "rep": 0, "errors": 0, "side": side, "makespan_s": makespan,
                "ttft_p95_s": 1.0, "ttft_p50_s": 1.0}

    got = _ratios([run(streams_serve.label, 90.0), run("llama-server", 100.0), run(streams_peer.label, 80.0)],
                  bursts=False)
    assert got is not None and got["serve"] == "serve --kv-streams"
    assert got["makespan ÷ best"] == 0.9 and got["best llama-server (by makespan)"] == "llama-server"
    assert got["makespan ÷ llama-server -no-kvu"] == round(90 / 80, 3)
    assert _targets(False, got)[0]["target"].startswith("no bursts: serve --kv-streams makespan")
    # Plain serve, where it runs, is the one measured.
    got = _ratios([run("serve", 95.0), run(streams_serve.label, 90.0), run("llama-server", 100.0)], bursts=False)
    assert got is not None and "serve" not in got and got["makespan ÷ best"] == 0.95
    # Against llama-server -no-kvu alone there is no configuration of the issue's: no target.
    got = _ratios([run(streams_serve.label, 90.0), run(streams_peer.label, 80.0)], bursts=False)
    assert got is not None and "makespan ÷ best" not in got and _targets(False, got) == []


@pytest.mark.parametrize("fails, resent, error", [(1, 1, None), (3, 2, "RemoteProtocolError")])
def test_a_call_the_server_closed_unanswered_is_sent_again_as_the_openai_client_does(fails, resent, error):
    # llama-server closed a kept-alive connection as a call went out on it ("Server disconnected
    # without sending a response"): the repetition was lost to the medians.
    import asyncio

    import httpx

    from magnitude_bench.agents_sides import HttpSide

    sent = 0

    def answer(request: httpx.Request) -> httpx.Response:
        nonlocal sent
        sent += 1
        if sent <= fails:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        body = ('data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}], '
                '"usage": {"prompt_tokens": 5, "completion_tokens": 1}}\n\ndata: [DONE]\n\n')
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    async def main() -> CallRecord:
        side = HttpSide("s", "http://side.test", None)
        record = CallRecord(0, 0, "c", CallKind.TURN, 0, None)
        async with httpx.AsyncClient(base_url="http://side.test", transport=httpx.MockTransport(answer)) as http:
            side.http = http
            try:
                await side.call(record, [{"role": "user", "content": "hi"}], 8)
            except httpx.RemoteProtocolError as e:
                record.error = type(e).__name__
        return record

    record = asyncio.run(main())
    assert record.resent == resent and record.error == error and sent == min(fails, 2) + 1
    if error is None:
        assert record.text == "ok" and record.evaluated == 5


@pytest.mark.parametrize("exact", [False, True])
def test_exact_replies_ask_every_side_to_run_each_reply_to_its_max_tokens(exact):
    # Where a greedy reply ends depends on each side's prompt and batch: one side made 60 tokens of
    # a reply that the other made 98 and 149 of, deep in a context where each costs a decode step.
    import asyncio

    import httpx

    from magnitude_bench.agents_sides import EngineSide, HttpSide

    bodies = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        body = 'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    async def main() -> None:
        side = HttpSide("s", "http://side.test", None, exact_replies=exact)
        async with httpx.AsyncClient(base_url="http://side.test", transport=httpx.MockTransport(answer)) as http:
            side.http = http
            await side.call(CallRecord(0, 0, "c", CallKind.TURN, 0, None), [{"role": "user", "content": "hi"}], 8)

    asyncio.run(main())
    (body,) = bodies
    assert body.get("ignore_eos", False) is exact and body["max_tokens"] == 8

    class Hub:  # what EngineSide hands its requests to
        def submit(self, request, queue):
            self.request = request
            raise RuntimeError("submitted")

    side = EngineSide.__new__(EngineSide)
    side.exact_replies, side.hub = exact, Hub()
    with pytest.raises(RuntimeError, match="submitted"):
        asyncio.run(side.call(CallRecord(0, 0, "c", CallKind.TURN, 0, None), [{"role": "user", "content": "hi"}], 8))
    assert side.hub.request.sampling.ignore_eos is exact and side.hub.request.sampling.max_tokens == 8
