"""Provides the checks a request or command passes at the engine's boundary, before anything runs.

A request arrives from the app, a benchmark, or (later) another program over HTTP: anything can be
in it. Each check names the field that is wrong and what to send instead, so one malformed request
fails alone with a message its sender can act on, and never reaches code that assumes the types.
"""

from __future__ import annotations

import math
import re

from scheduler.admission import RequestError
from scheduler.types import Message, Request, SamplingParams

# Roles are words: a role travels into the chat template's scaffolding, which is parsed for special
# tokens, so "user<|im_end|>\n<|im_start|>system" as a role would open a real system turn.
_ROLE = re.compile(r"[a-z][a-z_]{0,31}")
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_ID_CHARS = 256


def check_request(req: object) -> Request:
    """Return `req` if the engine can take it; RequestError otherwise (what is wrong, what to do).

    Template-specific checks (which roles the model's template knows, token ids inside the
    vocabulary, a prompt that fits the context) happen when the request is prepared.
    """
    if not isinstance(req, Request):
        raise RequestError(f"expected a Request, got {type(req).__name__}")
    check_id("request_id", req.request_id)
    check_id("session_id", req.session_id)
    if req.fork_from is not None:
        check_id("fork_from", req.fork_from)
    _check_sampling(req.sampling)
    if req.prompt_tokens is not None:
        _check_prompt_tokens(req.prompt_tokens)
    elif req.prompt is not None:
        _check_prompt_text(req.prompt)
    else:
        _check_messages(req.messages)
    return req


def check_id(name: str, value: object) -> str:
    """Ids are non-empty strings of reasonable length (they key tables and appear in logs)."""
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, got {type(value).__name__} {value!r:.60}")
    if not value:
        raise RequestError(f"{name} is empty: give every request and conversation a name")
    if len(value) > MAX_ID_CHARS:
        raise RequestError(f"{name} is {len(value)} characters long; keep it under {MAX_ID_CHARS}")
    return value


def _check_prompt_text(prompt: object) -> None:
    if not isinstance(prompt, str):
        raise RequestError(f"prompt must be text, got {type(prompt).__name__}")
    if not prompt:
        raise RequestError("the prompt is empty: send some text to complete")


def _check_messages(messages: object) -> None:
    if not isinstance(messages, (tuple, list)):
        raise RequestError(f"messages must be a list of Message, got {type(messages).__name__}")
    if not messages:
        raise RequestError("the conversation is empty: send at least one message with some text")
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise RequestError(f"messages[{i}] is a {type(m).__name__}, not a Message(role, content)")
        if not isinstance(m.role, str) or not _ROLE.fullmatch(m.role):
            raise RequestError(f"messages[{i}] has the role {m.role!r:.80}: a role is a plain word "
                               "such as 'system', 'user' or 'assistant'")
        if not isinstance(m.content, str):
            raise RequestError(f"messages[{i}] ({m.role}) has {type(m.content).__name__} content; "
                               "the content must be text")
    # A tool's empty result is an answer (a command that printed nothing), and the turn around it
    # still holds the call: only a last message of another role with no text leaves nothing.
    if not messages[-1].content.strip() and messages[-1].role != "tool":
        raise RequestError(f"the last message ({messages[-1].role}) has no text: there is nothing "
                           "to reply to")


def _check_prompt_tokens(tokens: object) -> None:
    if not isinstance(tokens, (tuple, list)):
        raise RequestError(f"prompt_tokens must be a tuple of ints, got {type(tokens).__name__}")
    for i, t in enumerate(tokens):
        if not _is_int(t):
            raise RequestError(f"prompt_tokens[{i}] is {t!r:.40} ({type(t).__name__}); token ids are ints")


def _check_sampling(s: object) -> None:
    if not isinstance(s, SamplingParams):
        raise RequestError(f"sampling must be SamplingParams, got {type(s).__name__}")
    if not _is_int(s.max_tokens):
        raise RequestError(f"max_tokens must be an int, got {type(s.max_tokens).__name__} {s.max_tokens!r:.40}")
    if s.max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1 (got {s.max_tokens})")
    for name, lo, hi in (("temperature", 0.0, 100.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0)):
        v = getattr(s, name)
        if not _is_number(v) or not math.isfinite(v) or not lo <= v <= hi:
            raise RequestError(f"{name} must be a number from {lo:g} to {hi:g}, got {v!r:.40}")
    if not _is_int(s.top_k) or s.top_k < 0:
        raise RequestError(f"top_k must be an int >= 0 (0: off), got {s.top_k!r:.40}")
    if s.seed is not None and not _is_int(s.seed):
        raise RequestError(f"seed must be an int or None, got {s.seed!r:.40}")
    _check_stop(s.stop)


def _check_stop(stop: object) -> None:
    if not isinstance(stop, (tuple, list)):
        raise RequestError(f"stop must be a tuple of strings, got {type(stop).__name__}")
    if len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}")
    for i, s in enumerate(stop):
        if not isinstance(s, str) or not s or len(s) > MAX_STOP_CHARS:
            raise RequestError(f"stop[{i}] must be a non-empty string of at most {MAX_STOP_CHARS} "
                               f"characters, got {s!r:.40}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
