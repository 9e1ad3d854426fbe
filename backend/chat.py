"""Provides tokenization against a llama vocab: chat templates rendered with Jinja, safe message bodies, incremental detokenization."""

from __future__ import annotations

import codecs
import ctypes
import dataclasses
import json
import logging
import re
from datetime import datetime
from typing import Sequence

import jinja2
import jinja2.sandbox
import llama_cpp

from backend.template_fallback import TemplateSource, fallback_notice, template_info, text_markers
from backend.tools import detect_syntax, generic_messages, tool_json
from scheduler.admission import RequestError
from scheduler.types import Message, Tool

# Used when a GGUF carries no chat template.
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Message bodies are replaced by these markers while rendering, so that after rendering we know
# which characters came from the template (parsed for special tokens) and which from a message
# (never parsed: typing "<|im_start|>system" must stay ordinary text).
_MARK = re.compile("\ue000(\\d+)\ue001")
# Every chat template renders these; "tool" only where the template names it.
STANDARD_ROLES = ("system", "user", "assistant")
log = logging.getLogger("backend.chat")


class Vocab:
    """Tokenizer over a loaded model's vocab. Not thread-safe (the engine thread owns it)."""

    def __init__(self, model) -> None:
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos = llama_cpp.llama_vocab_eos(self._vocab)
        raw = llama_cpp.llama_model_chat_template(model, None)
        self.chat_template = raw.decode("utf-8") if raw else CHATML
        self._choose_template(fallback=not raw)
        self._piece_buf = ctypes.create_string_buffer(256)
        self._template = _compile(self.chat_template)
        # Roles reach the scaffolding, which is parsed for special tokens: only the template's own
        # roles may pass (a generic ChatML template would render any text as a role).
        self.roles = STANDARD_ROLES + (("tool",) if "tool" in self.chat_template else ())
        self.tool_syntax = detect_syntax(self.chat_template)
        # Gemma's templates raise on a system message (or drop it): like llama.cpp's template
        # engine, such a prompt then goes to the start of the first user message.
        self.system_role = self._renders_system()

    def _choose_template(self, *, fallback: bool) -> None:
        """Where the template came from; with the ChatML fallback, the markers a reply must stop
        on as text (no end-of-generation token exists for them) and the notice for the user."""
        self.template_source = TemplateSource.CHATML_FALLBACK if fallback else TemplateSource.MODEL
        self.chat_stops: tuple[str, ...] = (text_markers(lambda m: self.tokenize(m, special=True))
                                            if fallback else ())
        self.template_notice = fallback_notice(self.chat_stops) if fallback else None
        if self.template_notice:
            log.warning(self.template_notice)

    def template_info(self) -> dict[str, str]:
        """What EngineReady.info says about the chat template (the app shows the notice)."""
        return template_info(self.template_source, self.template_notice)

    @property
    def native(self):
        """The llama_vocab handle (grammar samplers are built over it)."""
        return self._vocab

    def token_text(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", errors="replace") if token >= 0 else ""

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_bos, special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_bos, special)
        if n < 0:
            raise ValueError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece_buf, len(self._piece_buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def render_chat(self, messages: Sequence[Message], *, tools: Sequence[Tool] = (),
                    add_generation_prompt: bool = True) -> list[tuple[str, bool]]:
        """Render the template; return (text, is_scaffold) segments in order.

        Tools and tool turns go through the template when it renders them (as llama-server's
        `--jinja` does); otherwise through the generic format (backend/tools.py)."""
        if not self.tool_syntax.template_renders_tools and (
                tools or any(m.role == "tool" or m.tool_calls for m in messages)):
            messages = generic_messages(messages, tools)
        if not self.system_role:
            messages = _system_into_user(messages)
        for m in messages:
            if m.role not in self.roles:
                raise RequestError(f"unknown chat role {m.role!r:.80}: this model's chat template "
                                   f"knows {', '.join(self.roles)}")
        marked = [_marked(i, m) for i, m in enumerate(messages)]
        extra = {"tools": [tool_json(t) for t in tools]} if tools else {}
        # Tool names, schemas and call arguments reach the scaffolding, which is parsed for special
        # tokens: none of them may spell one. The error names the field at fault (serve's `param`).
        if extra:
            self._refuse_control_text(json.dumps(extra), "tools: a tool definition")
        calls = [m["tool_calls"] for m in marked if m.get("tool_calls")]
        if calls:
            self._refuse_control_text(json.dumps(calls), "a tool call in the conversation")
        rendered = self._template.render(
            messages=marked,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token_text(self.bos),
            eos_token=self.token_text(self.eos),
            **extra,
        )
        segments: list[tuple[str, bool]] = []
        pos = 0
        for mark in _MARK.finditer(rendered):
            if mark.start() > pos:
                segments.append((rendered[pos:mark.start()], True))
            segments.append((messages[int(mark.group(1))].content, False))
            pos = mark.end()
        if pos < len(rendered):
            segments.append((rendered[pos:], True))
        return segments

    def _renders_system(self) -> bool:
        """Whether the template renders a system message's text (rather than raising or
        dropping it). A template that will not render a lone user message either says nothing
        about system messages: they are left as they are."""
        system = {"role": "system", "content": "\ue0000\ue001"}
        user = {"role": "user", "content": "\ue0001\ue001"}
        render = lambda messages: self._template.render(  # noqa: E731
            messages=messages, add_generation_prompt=True, bos_token=self.token_text(self.bos),
            eos_token=self.token_text(self.eos))
        try:
            return "\ue0000\ue001" in render([system, user])
        except Exception:  # raise_exception('System role not supported'), or another refusal
            try:
                render([user])
            except Exception:
                return True
            return False

    def _refuse_control_text(self, text: str, what: str) -> None:
        if self.tokenize(text, special=True) != self.tokenize(text, special=False):
            raise RequestError(f"{what} spells one of the model's control tokens")

    def tokenize_chat(self, messages: Sequence[Message], *, tools: Sequence[Tool] = (),
                      add_generation_prompt: bool = True) -> list[int]:
        tokens: list[int] = []
        for text, scaffold in self.render_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt):
            if text:
                tokens += self.tokenize(text, special=scaffold)
        if self.add_bos and (not tokens or tokens[0] != self.bos):
            tokens.insert(0, self.bos)
        return tokens


class Detokenizer:
    """Streams text for one sequence: pieces are bytes and may split a UTF-8 character."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._vocab.piece(token))

    def flush(self) -> str:
        """The reply ended: a character whose last bytes never came (max_tokens, a cancel, the
        context's end) is dropped, not shown as U+FFFD; the decoder only ever buffers such a tail."""
        self._decoder.reset()
        return ""


def _system_into_user(messages: Sequence[Message]) -> list[Message]:
    """System messages' text put before the next user message's (a user message of its own
    when none follows), for a template without a system role."""
    out: list[Message] = []
    held: list[str] = []
    for m in messages:
        if m.role == "system":
            held.append(m.content)
        elif m.role == "user" and held:
            out.append(dataclasses.replace(m, content="\n\n".join(held + [m.content])))
            held = []
        else:
            out.append(m)
    if held:
        out.append(Message("user", "\n\n".join(held)))
    return out


def _marked(i: int, m: Message) -> dict:
    """A message as the template reads it, its content replaced by a marker (see _MARK)."""
    out: dict = {"role": m.role, "content": f"\ue000{i}\ue001"}
    if m.tool_calls:
        # Templates index arguments as a mapping (llama-server parses them the same way).
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _arguments(text: str):
    try:
        return json.loads(text or "{}")
    except ValueError:
        return text


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _compile(source: str) -> jinja2.Template:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
