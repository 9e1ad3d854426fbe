"""Provides POST /v1/completions: a raw prompt continued as is (no chat template), in OpenAI's text_completion shapes."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI
from fastapi import Request as HttpRequest

from magnitude_tui.serve.calls import (
    Outcome,
    ServeOptions,
    address,
    answer,
    check_room,
    choice_error,
    stream_events,
    take_body,
)
from magnitude_tui.serve.completion import Completion
from magnitude_tui.serve.errors import OpenAIError, invalid
from magnitude_tui.serve.fields import CallFields, default, integer, parse_call, refuse_penalties
from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.serve.tools_body import ToolUse
from scheduler.types import Request, SamplingParams

# OpenAI's default for /v1/completions (vLLM's too): a base model given no limit rarely stops.
DEFAULT_MAX_TOKENS = 16
# Parameters that change what a completion means; silently ignoring them would answer another question.
UNSUPPORTED = ("suffix", "logit_bias", "response_format", "tools", "tool_choice")


@dataclass(frozen=True, kw_only=True)
class TextCall(CallFields):
    """What one POST /v1/completions asks for: the shared fields (fields.py) and one prompt (text,
    or token ids)."""

    prompt: str | tuple[int, ...]
    tool_use: ToolUse = ToolUse()  # none: a text completion takes no tools or response format


def parse_text_call(body: object) -> TextCall:
    """A TextCall, or OpenAIError (400) naming the first parameter that is wrong."""
    if not isinstance(body, dict):
        raise invalid(None, "the request body must be a JSON object", "invalid_json")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, "", [], {}):
            raise invalid(name, f"'{name}' is not supported by this server", "unsupported_parameter")
    for name in ("logprobs", "echo"):
        if body.get(name) not in (None, False, 0):
            raise invalid(name, f"'{name}' is not supported by this server", "unsupported_parameter")
    if integer(body, "best_of", lo=1) not in (None, 1):
        raise invalid("best_of", "'best_of' other than 1 is not supported by this server", "unsupported_parameter")
    refuse_penalties(body)
    prompt = _prompt(body.get("prompt"))
    max_tokens = default(integer(body, "max_tokens", lo=1), DEFAULT_MAX_TOKENS)
    return parse_call(body, TextCall, max_tokens=max_tokens, prompt=prompt)


def _prompt(raw: object) -> str | tuple[int, ...]:
    """One prompt: a string, or an array of token ids (OpenAI's other forms hold several prompts)."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]  # one prompt in OpenAI's array form
    if isinstance(raw, str):
        if not raw:
            raise invalid("prompt", "'prompt' is empty: send some text to complete")
        return raw
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return tuple(raw)
    if isinstance(raw, list) and len(raw) > 1 and all(isinstance(p, (str, list)) for p in raw):
        raise invalid("prompt", "send one prompt per request (several prompts in one call are not "
                      "supported; 'n' asks for several completions of one prompt)")
    raise invalid("prompt", "'prompt' must be a non-empty string or an array of token ids")


class TextCompletion(Completion):
    """A Completion whose requests carry the raw prompt: the engine tokenizes it without the chat
    template (special-token parsing off); choices, forks of one evaluated prompt, usage and
    timings are the chat call's."""

    call: TextCall  # type: ignore[assignment]  # in the ChatCall's place: the fields a Completion reads, and the prompt

    def __init__(self, hub: EngineHub, call: TextCall, *, client_name: str) -> None:
        super().__init__(hub, call, client_name=client_name)  # type: ignore[arg-type]
        self.id = f"cmpl-{uuid.uuid4().hex[:24]}"

    def _request(self, rid: str, session: str, sampling: SamplingParams, fork_from: str | None) -> Request:
        text, tokens = (self.call.prompt, None) if isinstance(self.call.prompt, str) else (None, self.call.prompt)
        return Request(request_id=rid, session_id=session, messages=(), sampling=sampling,
                       fork_from=fork_from, priority=self.call.priority_class, prompt=text, prompt_tokens=tokens)

    async def start(self) -> None:
        try:
            await super().start()
        except OpenAIError as e:
            if e.param == "messages":  # a refusal names the chat field; here the prompt is at fault
                e.param = "prompt"
            raise


def register(api: FastAPI, hub: EngineHub, options: ServeOptions,
             on_finish: Callable[[Completion, Outcome], None] | None) -> None:
    """Add POST /v1/completions to the app (serve/app.py's create_app calls this)."""

    @api.post("/v1/completions")
    async def completions(request: HttpRequest):
        call = parse_text_call(await take_body(request, hub, options))
        check_room(hub, options, call.n)
        completion = TextCompletion(hub, call, client_name=call.user or address(request))
        return await answer(request, completion, on_finish, lambda c: _reply(c, options),
                            lambda: _stream(completion, options, on_finish))


def _body(completion: TextCompletion, options: ServeOptions, choices: list[dict], **extra) -> dict:
    return {"id": completion.id, "object": "text_completion", "created": completion.created,
            "model": options.model_name, "choices": choices, **extra}


def _choice(index: int, text: str, finish_reason: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def _reply(completion: TextCompletion, options: ServeOptions) -> dict:
    choices = [_choice(c.index, c.text, c.finish_reason or "error") | choice_error(c) for c in completion.choices]
    return _body(completion, options, choices, usage=completion.usage(), timings=completion.timings())


def _stream(completion: TextCompletion, options: ServeOptions, on_finish):
    def chunk(choices: list[dict], **extra) -> str:
        return json.dumps(_body(completion, options, choices, **extra), ensure_ascii=False)
    return stream_events(completion, on_finish, chunk, lambda d: {"text": d.text, "logprobs": None})
