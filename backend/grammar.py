"""Provides the grammars a constrained reply samples under: a JSON schema's, and a request's tool calls'."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from itertools import accumulate

from backend.tools import ToolSyntax
from scheduler.types import Grammar, Request, Tool, ToolChoiceMode


class GrammarError(ValueError):
    """A schema or tool list that cannot be turned into a grammar; the message names the part."""


# The converter spells a bound out: `maxLength: N` or `maxItems: N` becomes N nested optional
# groups, `minLength: N` N symbols. llama.cpp's grammar parser recurses once per nested group, so
# `maxLength: 20000` overflowed the engine's stack (SIGSEGV: the worker and every reply in flight
# with it). From about 1,000 levels llama.cpp refuses the grammar itself ("exceeds sane defaults"),
# but only when the sampler is built, after the prompt was evaluated, as a 500; refused here it is a
# 400 naming the parameter. A huge bound is refused before the converter writes it out.
MAX_BOUND = 100_000  # a schema's minLength, maxItems, ... or a pattern's {n,m}
MAX_DEPTH = 1_024  # nested groups in one rule (llama.cpp took maxLength 1000, refused 1030)
MAX_GRAMMAR_CHARS = 8 * 2**20
_BOUND_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_LITERALS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')  # GBNF strings and character classes


def _check_bounds(schema: object, where: str) -> None:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in _BOUND_KEYS and isinstance(value, int) and value > MAX_BOUND:
                    raise GrammarError(f"{where}: '{key}' {value} is over {MAX_BOUND:,}, more than a grammar "
                                       "can spell out")
                if key == "pattern" and isinstance(value, str) and any(
                        int(n or 0) > MAX_BOUND for m in _QUANTIFIER.finditer(value) for n in m.groups()):
                    raise GrammarError(f"{where}: a repetition in 'pattern' is over {MAX_BOUND:,}, more than a "
                                       "grammar can spell out")
                stack.append(value)


@dataclass(frozen=True)
class ReplyConstraint:
    """How one request's reply is constrained and parsed.

    `grammar` holds from the first token (a response schema, `tool_choice` required or a named
    function); `on_open` takes over when the model opens a call by itself (`auto`): the text before
    it is free. `syntax` is the tool-call form to parse out of the reply (None: no calls expected).
    """

    grammar: Grammar | None = None
    on_open: Grammar | None = None
    syntax: ToolSyntax | None = None


def reply_constraint(req: Request, syntax: ToolSyntax) -> ReplyConstraint:
    """GrammarError when a schema cannot be converted (the request fails alone)."""
    if req.response_schema is not None:
        return ReplyConstraint(grammar=schema_grammar(req.response_schema, "response_format"))
    mode = req.tool_choice.mode
    if not req.tools or mode is ToolChoiceMode.NONE:
        return ReplyConstraint()
    tools = req.tools
    if mode is ToolChoiceMode.FUNCTION:
        tools = tuple(t for t in tools if t.name == req.tool_choice.name)
        if not tools:
            raise GrammarError(f"tool_choice names {req.tool_choice.name!r:.80}, which is not among the tools")
    if mode is ToolChoiceMode.AUTO:
        # The call form's own opening (Hermes' marker) is left to the model; the Llama 3 form has
        # no marker to wait for, so its calls are parsed and checked but not constrained.
        on_open = _calls_grammar(syntax, tools, req.parallel_tool_calls, after_open=True) if syntax.open else None
        return ReplyConstraint(on_open=on_open, syntax=syntax)
    return ReplyConstraint(grammar=_calls_grammar(syntax, tools, req.parallel_tool_calls, after_open=False),
                           syntax=syntax)


def schema_grammar(schema_text: str, where: str) -> Grammar:
    conv = _converter()
    _check_bounds(json.loads(schema_text), where)
    try:
        schema = conv.resolve_refs(json.loads(schema_text), "input")
        conv.visit(schema, "")
    except Exception as e:  # the converter raises what it likes on schemas it cannot express
        raise GrammarError(f"{where}: the JSON schema cannot be turned into a grammar ({e})") from None
    return _grammar(conv, where)


def _calls_grammar(syntax: ToolSyntax, tools: tuple[Tool, ...], parallel: bool, *, after_open: bool) -> Grammar:
    """Calls of these tools in `syntax`'s form, laid out exactly as `call_text` writes them (so a
    caller replaying the call in its history renders the very tokens the model wrote, and only
    the tool's result is new to prefill). `after_open`: the grammar starts right after the opening
    marker the model has just written, and may go on with more calls."""
    conv = _converter()
    lit = conv._format_literal
    alts = []
    for i, tool in enumerate(tools):
        _check_bounds(json.loads(tool.parameters), f"tools[{i}].function.parameters")
        try:
            params = conv.resolve_refs(json.loads(tool.parameters), f"tool-{i}")
            args = conv.visit(params, f"tool-{i}-args")
        except Exception as e:
            raise GrammarError(f"tools[{i}].function.parameters: the JSON schema cannot be turned into "
                               f"a grammar ({e})") from None
        head = lit(f'{{"name": {json.dumps(tool.name)}, "{syntax.args_key}": ')
        alts.append(conv._add_rule(f"tool-{i}-call", f'{head} {args} {lit("}")}'))
    conv._add_rule("call", " | ".join(alts))
    if syntax.open is None:
        root = "call"  # one call is the whole reply
    else:
        close = lit(f"\n{syntax.close}")
        conv._add_rule("block", f'{lit(syntax.open + chr(10))} call {close}')
        more = f' ({lit(chr(10))} block)*' if parallel else ""
        root = f'{lit(chr(10))}? call {close}{more}' if after_open else f"block{more}"
    conv._rules["root"] = root
    return _grammar(conv, "tools")


def _grammar(conv, where: str) -> Grammar:
    # JSON forbids raw control characters inside strings; this converter's `char` lets them through
    # (a newline in a string made replies that json.loads refuses), so they are excluded here.
    gbnf = conv.format_grammar().replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]', 1)
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{where}: the JSON schema makes a grammar of {len(gbnf):,} characters "
                           f"(at most {MAX_GRAMMAR_CHARS:,})")
    depth = max(accumulate(1 if p == "(" else -1 for p in re.findall(r"[()]", _LITERALS.sub("", gbnf))), default=0)
    if depth > MAX_DEPTH:
        raise GrammarError(f"{where}: the JSON schema makes a grammar nested {depth:,} levels deep (at most "
                           f"{MAX_DEPTH:,}; a 'maxLength' or 'maxItems' that large cannot be constrained)")
    return Grammar(gbnf)


def _converter():
    # llama-cpp-python's JSON-schema-to-GBNF converter (the one llama.cpp's own tools mirror).
    from llama_cpp.llama_grammar import SchemaConverter

    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
