"""The tool-call stream parser and the grammars of constrained replies (backend/tools.py, backend/grammar.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.grammar import GrammarError, reply_constraint, schema_grammar
from backend.tools import ToolCallParser, ToolSyntax, call_text, detect_syntax, generic_messages
from scheduler.types import Message, Request, Tool, ToolCall, ToolChoice, ToolChoiceMode

WEATHER = Tool("get_weather", "Current weather", json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
     "required": ["city"]}))


def _run(parser: ToolCallParser, text: str, cuts: list[int]) -> tuple[str, dict[int, dict]]:
    pieces, last = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        pieces.append(text[last:c])
        last = c
    out = ""
    calls: dict[int, dict] = {}
    for p in pieces:
        t, deltas = parser.feed(p)
        out += t
        for d in deltas:
            call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id is not None:
                assert call["id"] is None, "a call's id and name come once"
                call["id"], call["name"] = d.id, d.name
            call["arguments"] += d.arguments
    return out + parser.finish(), calls


ARGS = st.dictionaries(st.sampled_from(["city", "q", "n"]),
                       st.one_of(st.text(max_size=12), st.integers(), st.lists(st.integers(), max_size=3)),
                       max_size=3)


@settings(max_examples=150, deadline=None)
@given(before=st.text(alphabet="abc ,.<>_\n{}\"", max_size=20), args=st.lists(ARGS, min_size=1, max_size=3),
       cuts=st.lists(st.integers(0, 400), max_size=12))
def test_hermes_calls_are_parsed_whatever_the_pieces(before, args, cuts):
    if "<tool_call>" in before or before.endswith(("<", "<t", "<to")):
        return
    text = before + "\n".join(call_text(ToolSyntax.HERMES, f"f{i}", json.dumps(a)) for i, a in enumerate(args))
    out, calls = _run(ToolCallParser(ToolSyntax.HERMES), text, cuts)
    assert out.strip() == before.strip() or out == before
    assert [calls[i]["name"] for i in range(len(args))] == [f"f{i}" for i in range(len(args))]
    assert [json.loads(calls[i]["arguments"]) for i in range(len(args))] == args
    assert all(c["id"].startswith("call_") for c in calls.values())


@settings(max_examples=60, deadline=None)
@given(args=ARGS, cuts=st.lists(st.integers(0, 200), max_size=10))
def test_llama3_json_form_is_a_call_only_at_the_start(args, cuts):
    text = call_text(ToolSyntax.LLAMA3, "lookup", json.dumps(args))
    out, calls = _run(ToolCallParser(ToolSyntax.LLAMA3), "  " + text, cuts)
    assert out == "" and calls[0]["name"] == "lookup" and json.loads(calls[0]["arguments"]) == args
    out, calls = _run(ToolCallParser(ToolSyntax.LLAMA3), "Sure: " + text, cuts)
    assert out == "Sure: " + text and calls == {}


def test_a_call_with_keys_in_another_order_comes_whole_and_garbage_stays_text():
    parser = ToolCallParser(ToolSyntax.HERMES)
    out, calls = _run(parser, 'a <tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>', [5, 20])
    assert out == "a " and calls[0]["name"] == "f" and json.loads(calls[0]["arguments"]) == {"x": 1}
    out, calls = _run(ToolCallParser(ToolSyntax.HERMES), "x <tool_call>not json</tool_call> y", [3])
    assert out == "x <tool_call>not json</tool_call> y" and calls == {}


def test_an_unfinished_marker_is_text_at_the_end():
    out, calls = _run(ToolCallParser(ToolSyntax.HERMES), "see <tool_ca", [6])
    assert out == "see <tool_ca" and calls == {}


def test_a_call_cut_short_after_whole_calls_is_dropped_but_alone_it_is_text():
    whole = call_text(ToolSyntax.HERMES, "f", '{"x": 1}')
    for tail in ["\n<tool_call>\n{\"na", "\n<tool_ca", "\n<tool_call>"]:
        out, calls = _run(ToolCallParser(ToolSyntax.HERMES), whole + tail, [len(whole) + 2])
        assert out == "" and list(calls) == [0], tail
    out, calls = _run(ToolCallParser(ToolSyntax.HERMES), whole + " see <tool_ca", [])
    assert out == " see <tool_ca" and list(calls) == [0]  # text followed the call: it stays text
    out, calls = _run(ToolCallParser(ToolSyntax.HERMES), '<tool_call>\n{"na', [4])
    assert out == '<tool_call>\n{"na' and calls == {}


def test_syntax_is_read_off_the_template():
    assert detect_syntax("{{ messages }}") is ToolSyntax.GENERIC
    assert detect_syntax("{% for t in tools %}<tool_call>{% endfor %}") is ToolSyntax.HERMES
    assert detect_syntax("{% if tools %}<|python_tag|>{% endif %}") is ToolSyntax.LLAMA3
    assert detect_syntax("{% if tools %}{{ tools | tojson }}{% endif %}") is ToolSyntax.GENERIC


def test_generic_format_puts_tools_in_the_system_turn_and_results_in_user_turns():
    call = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    out = generic_messages((Message("system", "Be brief."), Message("user", "Weather?"),
                            Message("assistant", "", tool_calls=(call,)),
                            Message("tool", "rain", tool_call_id="call_1")), (WEATHER,))
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[0].content.startswith("Be brief.") and '"get_weather"' in out[0].content
    # The call is written exactly as the grammar makes the model write it (see the next test).
    assert out[2].content == call_text(ToolSyntax.GENERIC, "get_weather", '{"city": "Oslo"}')
    assert out[3].content == "<tool_response>\nrain\n</tool_response>"


def test_generic_format_gives_a_turns_parallel_results_one_user_turn():
    calls = (ToolCall("c1", "get_weather", '{"city": "Oslo"}'), ToolCall("c2", "get_weather", '{"city": "Rome"}'))
    out = generic_messages((Message("user", "Weather?"), Message("assistant", "", tool_calls=calls),
                            Message("tool", "rain", tool_call_id="c1"), Message("tool", "sun", tool_call_id="c2"),
                            Message("assistant", "Rain, then sun."), Message("user", "And Paris?"),
                            Message("tool", "fog", tool_call_id="c3")), (WEATHER,))
    assert [m.role for m in out] == ["system", "user", "assistant", "user", "assistant", "user", "user"]
    # Hermes and Qwen templates write consecutive results in one turn, in order.
    assert out[3].content == "<tool_response>\nrain\n</tool_response>\n<tool_response>\nsun\n</tool_response>"
    # A result after a person's message is a turn of its own: only results merge.
    assert out[5].content == "And Paris?" and out[6].content == "<tool_response>\nfog\n</tool_response>"


def test_grammars_follow_tool_choice():
    base = dict(request_id="r", session_id="s", messages=(Message("user", "hi"),), tools=(WEATHER,))
    auto = reply_constraint(Request(**base), ToolSyntax.HERMES)
    assert auto.grammar is None and auto.on_open is not None and auto.syntax is ToolSyntax.HERMES
    required = reply_constraint(Request(**base, tool_choice=ToolChoice(ToolChoiceMode.REQUIRED)), ToolSyntax.HERMES)
    assert required.grammar is not None and 'get_weather' in required.grammar.gbnf
    assert required.grammar.gbnf.count("root ::=") == 1
    none = reply_constraint(Request(**base, tool_choice=ToolChoice(ToolChoiceMode.NONE)), ToolSyntax.HERMES)
    assert none == type(none)()
    with pytest.raises(GrammarError, match="not among the tools"):
        reply_constraint(Request(**base, tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "nope")), ToolSyntax.HERMES)
    schema = reply_constraint(Request(request_id="r", session_id="s", messages=(Message("user", "hi"),),
                                      response_schema='{"type": "object"}'), ToolSyntax.GENERIC)
    assert schema.grammar is not None and schema.syntax is None


@pytest.mark.parametrize("schema, why", [
    ({"type": "string", "maxLength": 20000}, "nested 20,000 levels"),  # overflowed llama.cpp's parser: SIGSEGV
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 30000}, "nested"),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 10**9}}}, "'minLength' 1000000000"),
    ({"type": "string", "pattern": "^a{0,99999999999}$"}, "repetition in 'pattern'"),
    # Grammars llama.cpp takes but cannot sample in time: one token's mask ran for minutes.
    ({"type": "string", "pattern": "^((a{0,20}){0,20}){0,20}$"}, "can match nothing"),
    ({"type": "string", "pattern": "^(a?b?){0,100}$"}, "can match nothing"),
    ({"type": "string", "pattern": "^((a{1,20}){1,20}){1,20}$"}, "nested 8,000 times"),
    # Read otherwise by Python than by the converter, which builds the slow grammar all the same:
    # spaces in a bound (Python: text), a lazy repeat (the grammar: optional), an anchor inside
    # the pattern (the grammar: the character `$`, so the group's end is not its own).
    ({"type": "string", "pattern": "^((a{1, 20}){1, 20}){1, 20}$"}, "nested 8,000 times"),
    ({"type": "string", "pattern": "^(a+?){0,300}$"}, "can match nothing"),
    ({"type": "string", "pattern": "^((a|a$){1,500}\\$){1,500}$"}, "nested 250,000 times"),
])
def test_a_schema_whose_grammar_llama_cpp_cannot_take_is_refused_naming_the_parameter(schema, why):
    with pytest.raises(GrammarError, match=why) as e:
        schema_grammar(json.dumps(schema), "response_format")
    assert str(e.value).startswith("response_format:")
    tool = Tool("f", "", json.dumps({"type": "object", "properties": {"a": schema}}))
    request = Request(request_id="r", session_id="s", messages=(Message("user", "hi"),), tools=(tool,),
                      tool_choice=ToolChoice(ToolChoiceMode.REQUIRED))
    with pytest.raises(GrammarError, match="^tools"):
        reply_constraint(request, ToolSyntax.HERMES)


def test_bounds_llama_cpp_takes_still_make_grammars():
    for schema in ({"type": "string", "maxLength": 1000}, {"type": "array", "items": {"type": "integer"}, "maxItems": 1000},
                   {"type": "string", "minLength": 5000}, {"type": "string", "pattern": "^a{0,1000}$"},
                   {"type": "string", "pattern": r"^(\d{1,3}\.){3}\d{1,3}$"},
                   {"type": "string", "pattern": r"^[A-Z]{2}-\d{4}(-[A-Z]{1,3}){0,2}$"},
                   {"type": "string", "pattern": r"^[a-z]+(-[a-z]+)*$"}):
        assert schema_grammar(json.dumps(schema), "response_format").gbnf


def test_regex_escapes_in_a_pattern_become_what_the_grammar_knows():
    gbnf = schema_grammar(json.dumps({"type": "string", "pattern": r"^(\d{1,3}\.){3}\w+\s\S$"}), "response_format").gbnf
    assert "\\d" not in gbnf and "\\." not in gbnf and "[0-9]" in gbnf
    with pytest.raises(GrammarError, match=r"response_format: .*escape '\\\\b'"):  # a word boundary has no grammar
        schema_grammar(json.dumps({"type": "string", "pattern": r"^a\bb$"}), "response_format")


def test_an_atomic_group_in_a_pattern_is_read_as_a_group():
    # `(?>...)` carries its items directly: the pattern check read it as a group of one pair and
    # raised TypeError, which reached the caller as a failure to prepare the prompt.
    try:
        schema_grammar(json.dumps({"type": "string", "pattern": "^(?>ab|a)c$"}), "response_format")
    except GrammarError as e:
        assert "response_format" in str(e)
    with pytest.raises(GrammarError, match="can match nothing"):
        schema_grammar(json.dumps({"type": "string", "pattern": "^((?>a?)){0,50}$"}), "response_format")
