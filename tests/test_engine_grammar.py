"""Constrained rows in the shared batch: priced by the step budget, never drafted, grammar restarted mid-reply."""

from __future__ import annotations

import json

from backend.fake import FakeBackend
from backend.tools import ToolSyntax, call_text
from magnitude_tui.engine.core import Engine
from scheduler.budget import StepShape, parse_policy
from scheduler.cost_model import CostModel, CostParams
from scheduler.types import (
    DoneReason,
    Message,
    Phase,
    Request,
    SamplingParams,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
)

CPU = CostParams(fixed_ms=5.0, decode_ms=6.0, prefill_ms=4.0)
TOOL = Tool("lookup", "", json.dumps({"type": "object", "properties": {"q": {"type": "string"}}}))


def test_the_budget_leaves_room_for_sampling_under_a_grammar():
    policy, cost = parse_policy("target:200"), CostModel(CPU)
    free = policy.prefill_allowance(StepShape(decode_rows=4), cost)
    masked = policy.prefill_allowance(StepShape(decode_rows=4, sampling_ms=12.0), cost)
    # 12 ms of masking leaves 3 fewer 4 ms prompt rows in a 200 ms step.
    assert free - masked == 3


def _engine(reply: str) -> tuple[Engine, FakeBackend]:
    backend = FakeBackend(reply=reply, eog_after=len(reply))
    return Engine(backend, policy="target:50", spec="ngram", coalesce_ms=0), backend


def _run(engine: Engine, req: Request):
    engine.submit(req)
    text, calls, last = "", [], None
    for report in engine.run_until_idle():
        for u in report.updates:
            text += u.text_delta
            calls += u.tool_calls
            last = u
    return text, calls, last


def test_a_call_opened_mid_reply_switches_the_grammar_on_and_keeps_the_scripts_place():
    reply = "Looking. " + call_text(ToolSyntax.GENERIC, "lookup", '{"q": "x"}')
    engine, backend = _engine(reply)
    req = Request("r1", "s1", (Message("user", "find x"),), SamplingParams(max_tokens=400), tools=(TOOL,))
    text, calls, last = _run(engine, req)
    assert text == "Looking. " and last.phase is Phase.DONE and last.done_reason is DoneReason.STOP
    assert calls[0].name == "lookup" and "".join(c.arguments for c in calls) == '{"q": "x"}'
    # The sampler was rebuilt with the call's grammar once `<tool_call>` appeared, and the fake's
    # script went on from where it was (a restarted script would have repeated "Looking. ").
    assert backend.grammars and any(g is not None for g in backend.grammars.values())
    assert last.generated == len(reply)


def test_a_constrained_sequence_never_drafts_although_its_text_repeats():
    reply = "abcabcabcabcabcabcabcabcabcabcabcabcabcabcabcabc"
    engine, _ = _engine(reply)
    prompt = (Message("user", reply * 4),)
    schema = '{"type": "object"}'
    _, _, free = _run(engine, Request("free", "a", prompt, SamplingParams(max_tokens=40)))
    _, _, constrained = _run(engine, Request("json", "b", prompt, SamplingParams(max_tokens=40),
                                             response_schema=schema))
    assert free.spec.drafted > 0  # n-gram lookup drafts this text when nothing constrains it
    assert constrained.spec.drafted == 0


def test_tool_choice_required_starts_under_the_grammar_from_the_first_token():
    engine, backend = _engine(call_text(ToolSyntax.GENERIC, "lookup", "{}"))
    req = Request("r", "s", (Message("user", "go"),), SamplingParams(max_tokens=200), tools=(TOOL,),
                  tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
    _, calls, last = _run(engine, req)
    assert calls and calls[0].name == "lookup" and last.done_reason is DoneReason.STOP
    assert all(g is not None and "lookup" in g.gbnf for g in backend.grammars.values())


def test_the_sequences_panel_shows_the_mask_time_per_token_of_a_constrained_reply():
    from magnitude_tui.engine.events import SeqUpdate
    from magnitude_tui.widgets.sequences_panel import spec_text

    masked = SeqUpdate("r", "s", 0, Phase.GENERATING, generated=10, grammar_ms=14.0)
    assert spec_text(masked) == "mask 1.4"
    assert spec_text(SeqUpdate("r", "s", 0, Phase.GENERATING, generated=10)) == "—"


def test_a_conversation_waiting_on_its_tools_is_evicted_after_one_that_is_not():
    # Two slots. A's reply calls a tool (its agent is running it); B, newer, just chatted. C needs
    # a slot: plain LRU would drop A, the older; A keeps its KV and B goes instead.
    reply = call_text(ToolSyntax.GENERIC, "lookup", '{"q": "x"}')
    backend = FakeBackend(reply=reply, eog_after=len(reply), n_seq_max=2)
    engine = Engine(backend, policy="target:50", coalesce_ms=0)
    _, calls, _ = _run(engine, Request("a1", "A", (Message("user", "find x"),), SamplingParams(max_tokens=400),
                                       tools=(TOOL,)))
    assert calls and calls[0].name == "lookup"
    _run(engine, Request("b1", "B", (Message("user", "hi"),), SamplingParams(max_tokens=400)))
    _run(engine, Request("c1", "C", (Message("user", "hello"),), SamplingParams(max_tokens=400)))
    assert set(engine.scheduler.sessions) == {"A", "C"}
    # A's next turn (the tool's result) reuses the KV it kept; answered in plain text, A is an
    # ordinary idle conversation again, and the next newcomer takes the least recently used slot.
    call = ToolCall(calls[0].id, "lookup", "".join(c.arguments for c in calls))
    history = (Message("user", "find x"), Message("assistant", "", tool_calls=(call,)),
               Message("tool", '{"found": 1}', tool_call_id=call.id))
    _, _, a2 = _run(engine, Request("a2", "A", history, SamplingParams(max_tokens=3)))
    assert a2.cached_tokens > 0 and not engine.scheduler.sessions["A"].awaits_tools
    _run(engine, Request("d1", "D", (Message("user", "hey"),), SamplingParams(max_tokens=400)))
    assert set(engine.scheduler.sessions) == {"A", "D"}


def test_a_stop_string_does_not_cut_a_call_parsed_without_a_grammar():
    # A Llama 3 call has no marker to constrain from: it is parsed, not masked. A stop string
    # inside its arguments ("}") cut it into a call whose JSON did not parse.
    reply = call_text(ToolSyntax.LLAMA3, "lookup", '{"q": "a}b"}')
    engine, backend = _engine(reply)
    backend.tool_syntax = ToolSyntax.LLAMA3
    req = Request("r1", "s1", (Message("user", "find x"),), SamplingParams(max_tokens=400, stop=("}",)),
                  tools=(TOOL,))
    text, calls, last = _run(engine, req)
    assert last.done_reason is DoneReason.STOP and text == ""
    assert calls[0].name == "lookup" and json.loads("".join(c.arguments for c in calls)) == {"q": "a}b"}
    assert all(g is None for g in backend.grammars.values())  # parsed only, as the test means



def _slow_masks(reply: str, ms_per_mask: float) -> tuple[Engine, FakeBackend]:
    """An engine whose every sample under a grammar takes `ms_per_mask` on its hand-moved clock
    (a slow mask is slow in engine time, however fast the test runs)."""
    from tests.test_warm_resume import ManualClock

    backend = FakeBackend(reply=reply, eog_after=40)
    clock = ManualClock()
    engine = Engine(backend, policy="target:50", coalesce_ms=0, clock=clock)
    plain_sample = backend.sample

    def sample(seq_id: int, row: int) -> int:
        if backend.grammars.get(seq_id) is not None:
            clock.now += ms_per_mask / 1000.0
        return plain_sample(seq_id, row)

    backend.sample = sample  # type: ignore[method-assign]
    return engine, backend


def test_a_grammar_too_slow_to_sample_fails_its_request_alone():
    # A 10,000-value enum kept thousands of grammar alternatives alive per token: hundreds of ms a
    # mask, and every other reply waited on each one (a 10-token call took 17.7 s instead of 0.4).
    from magnitude_tui.engine.sampling import MAX_MASK_MS

    engine, _ = _slow_masks("{}" + "x" * 40, 2 * MAX_MASK_MS)
    prompt = (Message("user", "answer"),)
    engine.submit(Request("json", "a", prompt, SamplingParams(max_tokens=20), response_schema='{"type": "object"}'))
    engine.submit(Request("free", "b", prompt, SamplingParams(max_tokens=20)))
    done = {u.request_id: u for report in engine.run_until_idle() for u in report.updates if u.phase is Phase.DONE}
    assert done["json"].done_reason is DoneReason.ERROR and done["json"].error.startswith("response_format")
    assert "simplify the schema" in done["json"].error and done["json"].generated == 0
    assert done["free"].done_reason is DoneReason.LENGTH and done["free"].generated == 20


def test_a_grammar_slow_on_average_fails_its_request_after_a_few_tokens():
    # Just under the one-token limit, token after token, stalls every step as much.
    from magnitude_tui.engine.sampling import MAX_MEAN_MASK_MS, MEAN_AFTER_TOKENS

    engine, _ = _slow_masks("x" * 40, 2 * MAX_MEAN_MASK_MS)
    engine.submit(Request("json", "a", (Message("user", "answer"),), SamplingParams(max_tokens=30),
                          response_schema='{"type": "string"}'))
    done = [u for report in engine.run_until_idle() for u in report.updates if u.phase is Phase.DONE]
    assert done[0].done_reason is DoneReason.ERROR and "on average" in done[0].error
    assert done[0].generated == MEAN_AFTER_TOKENS - 1  # the last mask's token is not kept


def test_a_grammar_too_slow_to_sample_names_what_it_came_from():
    # With tools and a response_format together, every slow grammar was blamed on response_format,
    # also the calls-only grammar of tool_choice "required" (the schema plays no part in it).
    from magnitude_tui.engine.sampling import MAX_MASK_MS

    schema, prompt = '{"type": "object"}', (Message("user", "answer"),)
    cases = {  # request id -> (what it asks, what the error must start with)
        "format": (dict(response_schema=schema), "response_format: the schema's grammar"),
        "required": (dict(tools=(TOOL,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)), "tools: "),
        "required+format": (dict(tools=(TOOL,), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED),
                                 response_schema=schema), "tools: "),
        "named+format": (dict(tools=(TOOL,), tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "lookup"),
                              response_schema=schema), "tools: "),
        "auto+format": (dict(tools=(TOOL,), response_schema=schema), "tools and response_format: "),
        "none+format": (dict(tools=(TOOL,), tool_choice=ToolChoice(ToolChoiceMode.NONE), response_schema=schema),
                        "response_format: "),
    }
    engine, _ = _slow_masks(call_text(ToolSyntax.GENERIC, "lookup", '{"q": "x"}'), 2 * MAX_MASK_MS)
    for rid, (fields, _) in cases.items():
        engine.submit(Request(rid, rid, prompt, SamplingParams(max_tokens=20), **fields))
    done = {u.request_id: u for report in engine.run_until_idle() for u in report.updates if u.phase is Phase.DONE}
    for rid, (_, start) in cases.items():
        assert done[rid].done_reason is DoneReason.ERROR and done[rid].error.startswith(start), (rid, done[rid].error)
        assert "simplify the schema" in done[rid].error
