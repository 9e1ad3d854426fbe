"""Provides the grammars a constrained reply samples under: a JSON schema's, and a request's tool calls'."""

from __future__ import annotations

import importlib
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


# llama.cpp keeps every way a grammar could have matched so far; a pattern whose repeated group can
# match nothing (`(a?){0,300}`) or that nests repetitions (`((a{0,20}){0,20}){0,20}`) has so many
# that masking one token took minutes: the engine's step, every sequence with it, stood still.
MAX_NESTED_REPEATS = 1_000  # the product of the bounds of repetitions nested in one another
try:  # the standard library's own regex parser
    _re_parser = importlib.import_module("re._parser")
except ImportError:  # Python 3.10 names it sre_parse
    _re_parser = importlib.import_module("sre_parse")


def _pattern_problem(pattern: str) -> str | None:
    """Why a `pattern` would make a grammar llama.cpp cannot sample in time (None: it can)."""
    # Python reads `{1, 20}` as text; the converter drops the spaces and repeats.
    pattern = _QUANTIFIER.sub(lambda m: "{" + m[1] + ("" if m[2] is None else "," + m[2]) + "}", pattern)
    try:
        tree = _re_parser.parse(pattern)
    except Exception:
        return None  # not Python's dialect: the converter decides
    repeats = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}

    def nullable(items) -> bool:
        return all(_nullable_item(str(op), av) for op, av in items)

    def _nullable_item(op: str, av) -> bool:
        if op in repeats:
            # A lazy or possessive repeat's extra mark (`a+?`) is read by the grammar as "optional".
            return op != "MAX_REPEAT" or av[0] == 0 or nullable(av[2])
        if op == "ATOMIC_GROUP":  # its argument is the group's items themselves
            return nullable(av)
        if op == "SUBPATTERN":
            return nullable(av[-1])
        if op == "BRANCH":
            return any(nullable(b) for b in av[1])
        return op in ("ASSERT", "ASSERT_NOT")  # an anchor inside a pattern becomes its literal character

    stack = [(tree, 1)]
    while stack:
        items, outer = stack.pop()
        for op, av in items:
            op = str(op)
            if op in repeats:
                lo, hi, sub = av
                bounded = hi != _re_parser.MAXREPEAT and hi >= 2
                if bounded and nullable(sub):
                    return f"a group repeated up to {hi} times that can match nothing"
                if bounded and outer > 1 and outer * hi > MAX_NESTED_REPEATS:
                    return f"repetitions nested {outer * hi:,} times over (at most {MAX_NESTED_REPEATS:,})"
                # A group that ends in a character found nowhere else in it (a hostname's label
                # and its dot) can be split into its repeats one way only: its repeats add no ways.
                stack.append((sub, outer * hi if bounded and not _delimited(sub) else outer))
            elif op == "ATOMIC_GROUP":
                stack.append((av, outer))
            elif op in ("SUBPATTERN", "ASSERT", "ASSERT_NOT"):
                stack.append((av[-1], outer))
            elif op == "BRANCH":
                stack.extend((b, outer) for b in av[1])
    return None


_ALL = ((0, 0x10FFFF),)


def _delimited(items) -> bool:
    """Whether `items` end in one character from a set that nothing before it can match."""
    items = list(items)
    while len(items) == 1 and str(items[0][0]) == "SUBPATTERN":  # a group: what it holds
        items = list(items[0][1][-1])
    if not items or str(items[-1][0]) not in ("LITERAL", "IN"):
        return False
    last = _chars(items[-1])
    return all(not _overlap(last, _chars(item)) for item in _flatten(items[:-1]))


def _flatten(items):
    """The character-matching items inside `items`, groups and repeats opened."""
    for op, av in items:
        op = str(op)
        if op in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            yield from _flatten(av[2])
        elif op == "ATOMIC_GROUP":
            yield from _flatten(av)
        elif op in ("SUBPATTERN", "ASSERT", "ASSERT_NOT"):
            yield from _flatten(av[-1])
        elif op == "BRANCH":
            for branch in av[1]:
                yield from _flatten(branch)
        else:  # an anchor (`$` inside a pattern) too: the converter writes it as that character
            yield op, av


def _chars(item) -> tuple[tuple[int, int], ...]:
    """The code points one item can match, as ranges (all of them where it is not simply read)."""
    op, av = str(item[0]), item[1]
    if op == "LITERAL":
        return ((av, av),)
    if op != "IN":
        return _ALL
    out = []
    for sop, sav in av:
        sop = str(sop)
        if sop == "LITERAL":
            out.append((sav, sav))
        elif sop == "RANGE":
            out.append(tuple(sav))
        elif sop == "CATEGORY" and str(sav) == "CATEGORY_DIGIT":
            out.append((ord("0"), ord("9")))
        else:  # a negated set, another category: anything
            return _ALL
    return tuple(out)


def _overlap(a, b) -> bool:
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


# The converter copies a pattern's escapes into the grammar as they are; llama.cpp knows only these
# (`\d`, `\.` made "failed to parse grammar", a 503 after the prompt was evaluated, for an IPv4 or a
# date pattern). So `\d`, `\w`, `\s` (and outside brackets `\D`, `\W`, `\S`) become classes and
# an escaped punctuation mark its \xHH code first.
_GBNF_ESCAPES = set('xuUtrn\\"[]')
_CLASSES = {"d": "0-9", "w": "A-Za-z0-9_", "s": " \\t\\n\\r\\x0B\\x0C"}


def _translate_pattern(pattern: str) -> str:
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            n = pattern[i + 1]
            i += 2
            if n in _CLASSES:
                out.append(_CLASSES[n] if in_class else f"[{_CLASSES[n]}]")
            elif n.lower() in _CLASSES and not in_class:
                out.append(f"[^{_CLASSES[n.lower()]}]")
            # Inside brackets llama.cpp knows only \[ \] \\ of these: `[\d\s\(\)\-]` (a phone number)
            # kept its \( and was refused; outside them the converter reads its own.
            elif not n.isalnum() and ord(n) < 128 and n not in ("[]\\" if in_class else "[]()|{}*+?"):
                out.append(f"\\x{ord(n):02X}" if in_class else f"[\\x{ord(n):02X}]")
            else:
                out.append(c + n)  # the converter's own (\( \[ ...) or llama.cpp's (\n \t \u ...)
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _translate_patterns(schema: object) -> object:
    if isinstance(schema, list):
        return [_translate_patterns(v) for v in schema]
    if isinstance(schema, dict):
        return {k: _translate_pattern(v) if k == "pattern" and isinstance(v, str) else _translate_patterns(v)
                for k, v in schema.items()}
    return schema


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
                if key == "pattern" and isinstance(value, str):
                    _check_pattern(value, where)
                stack.append(value)


def _check_pattern(pattern: str, where: str) -> None:
    if any(int(n or 0) > MAX_BOUND for m in _QUANTIFIER.finditer(pattern) for n in m.groups()):
        raise GrammarError(f"{where}: a repetition in 'pattern' is over {MAX_BOUND:,}, more than a grammar can "
                           "spell out")
    problem = _pattern_problem(pattern)
    if problem is not None:
        raise GrammarError(f"{where}: 'pattern' {pattern[:80]!r} has {problem}, which a grammar cannot sample in time")


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
    mode = req.tool_choice.mode
    calls_possible = bool(req.tools) and mode is not ToolChoiceMode.NONE
    if req.response_schema is not None and not calls_possible:
        return ReplyConstraint(grammar=schema_grammar(req.response_schema, "response_format"))
    if not calls_possible:
        return ReplyConstraint()
    if req.response_schema is not None and mode is ToolChoiceMode.AUTO:
        # Calls, or a final answer in the schema (an agent with tools and a structured output):
        # the reply is one or the other, constrained from its first token. A call form without a
        # marker (Llama 3's bare JSON) could not be told from an answer with a "name" field.
        if syntax.open is None:
            raise GrammarError("response_format: this model writes its tool calls as bare JSON, which an "
                               "answer in the schema could be taken for: send tool_choice \"none\" for the "
                               "answer's turn, or no response_format")
        return ReplyConstraint(grammar=_calls_grammar(syntax, req.tools, req.parallel_tool_calls, after_open=False,
                                                      or_schema=req.response_schema), syntax=syntax)
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
    _schema_rule(conv, json.loads(schema_text), where, "")
    return _grammar(conv, where)


def _schema_rule(conv, raw: object, where: str, name: str, url: str = "input") -> str:
    """Add the rules of JSON schema `raw` to `conv` under `name` ("": the root); returns its rule.
    GrammarError names `where` when the schema is out of bounds or cannot be expressed."""
    _check_bounds(raw, where)
    try:
        return conv.visit(conv.resolve_refs(_translate_patterns(raw), url), name)
    except Exception as e:  # the converter raises what it likes on schemas it cannot express
        raise GrammarError(f"{where}: the JSON schema cannot be turned into a grammar ({e})") from None


def _calls_grammar(syntax: ToolSyntax, tools: tuple[Tool, ...], parallel: bool, *, after_open: bool,
                   or_schema: str | None = None) -> Grammar:
    """Calls of these tools in `syntax`'s form, laid out exactly as `call_text` writes them (so a
    caller replaying the call in its history renders the very tokens the model wrote, and only
    the tool's result is new to prefill). `after_open`: the grammar starts right after the opening
    marker the model has just written, and may go on with more calls. `or_schema`: the reply may
    instead be JSON of this schema (the response format of a turn that calls nothing)."""
    conv = _converter()
    lit = conv._format_literal
    alts = []
    for i, tool in enumerate(tools):
        raw = json.loads(tool.parameters)
        _check_bounds(raw, f"tools[{i}].function.parameters")
        try:
            params = conv.resolve_refs(_translate_patterns(raw), f"tool-{i}")
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
    where = "tools"
    if or_schema is not None:
        raw = _prefixed_defs(json.loads(or_schema), "answer-")
        answer = _schema_rule(conv, raw, "response_format", "answer", "response-format")
        root, where = f"({root}) | {answer}", "response_format"
    conv._rules["root"] = root
    return _grammar(conv, where, "tools" if or_schema is None else "tools and response_format")


def _prefixed_defs(schema: object, prefix: str) -> object:
    """`schema` with its local definitions (`$defs`, `definitions`) renamed `prefix` + name, refs
    included: the converter names a ref's rule after the definition and reuses a rule of that
    name, so a tool's `$defs/Item` and the response schema's own `Item` became one rule."""
    def walk(v: object) -> object:
        if isinstance(v, list):
            return [walk(x) for x in v]
        if not isinstance(v, dict):
            return v
        out: dict[str, object] = {}
        for k, x in v.items():
            if k in ("$defs", "definitions") and isinstance(x, dict):
                out[k] = {prefix + name: walk(d) for name, d in x.items()}
            elif k == "$ref" and isinstance(x, str):
                out[k] = re.sub(r"^#/(\$defs|definitions)/", lambda m: m.group(0) + prefix, x)
            else:
                out[k] = walk(x)
        return out
    return walk(schema)


def _grammar(conv, where: str, source: str | None = None) -> Grammar:
    """`conv`'s grammar; GrammarError names `where`. `source`: the fields it comes from (`where`)."""
    # JSON forbids raw control characters inside strings; this converter's `char` lets them through
    # (a newline in a string made replies that json.loads refuses), so they are excluded here.
    gbnf = conv.format_grammar().replace('char ::= [^"\\\\]', 'char ::= [^"\\\\\\x7F\\x00-\\x1F]', 1)
    unknown = next((m.group(0) for m in re.finditer(r"\\(.)", gbnf) if m.group(1) not in _GBNF_ESCAPES), None)
    if unknown is not None:
        raise GrammarError(f"{where}: a 'pattern' uses the escape {unknown!r}, which the grammar cannot express")
    if len(gbnf) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"{where}: the JSON schema makes a grammar of {len(gbnf):,} characters "
                           f"(at most {MAX_GRAMMAR_CHARS:,})")
    depth = max(accumulate(1 if p == "(" else -1 for p in re.findall(r"[()]", _LITERALS.sub("", gbnf))), default=0)
    if depth > MAX_DEPTH:
        raise GrammarError(f"{where}: the JSON schema makes a grammar nested {depth:,} levels deep (at most "
                           f"{MAX_DEPTH:,}; a 'maxLength' or 'maxItems' that large cannot be constrained)")
    return Grammar(gbnf, source=source or where)


def _converter():
    # llama-cpp-python's JSON-schema-to-GBNF converter (the one llama.cpp's own tools mirror).
    from llama_cpp.llama_grammar import SchemaConverter

    return SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
