"""A conversation longer than its sequence drops its oldest turns instead of failing forever."""

from __future__ import annotations

import pytest

from backend.fake import FakeBackend
from magnitude_tui.engine.context import fit_conversation, headroom
from magnitude_tui.engine.core import Engine
from scheduler.types import DoneReason, Message, Request, SamplingParams
from tests.needs import need_real_model


def _words(messages) -> list[int]:
    return [0] * sum(4 + len(m.content.split()) for m in messages)  # 4 tokens of scaffold each


def _conversation(turns: int, words: int = 10) -> list[Message]:
    out = [Message("system", "be brief")]
    for i in range(turns):
        out += [Message("user", " ".join(["q"] * words)), Message("assistant", " ".join(["a"] * words))]
    return out + [Message("user", "and now?")]


def test_a_conversation_that_fits_is_sent_whole():
    messages = _conversation(3)
    fitted = fit_conversation(messages, _words, n_ctx_seq=256, max_tokens=64)
    assert fitted.dropped == 0 and len(fitted.prompt) == len(_words(messages))


def test_the_oldest_turns_go_first_and_the_system_prompt_stays():
    messages = _conversation(10)  # 6 + 10 * 28 + 6 = 292 tokens
    fitted = fit_conversation(messages, _words, n_ctx_seq=256, max_tokens=64)
    assert fitted.dropped % 2 == 0 and fitted.dropped > 0  # whole turns: user + assistant
    kept = [messages[0], *messages[1 + fitted.dropped:]]
    assert fitted.prompt == _words(kept)
    assert len(fitted.prompt) + headroom(256) <= 256
    # The fewest turns that leave the headroom: one turn fewer dropped would not.
    one_more = [messages[0], *messages[1 + fitted.dropped - 2:]]
    assert len(_words(one_more)) + headroom(256) > 256


def test_a_single_message_too_long_is_left_for_admission_to_refuse():
    messages = [Message("user", " ".join(["x"] * 400))]
    fitted = fit_conversation(messages, _words, n_ctx_seq=256, max_tokens=64)
    assert fitted.dropped == 0 and len(fitted.prompt) > 256


_SEEN: dict[str, list] = {}


def _run(engine: Engine, request: Request):
    engine.submit(request)
    updates = [u for r in engine.run_until_idle() for u in r.updates if u.request_id == request.request_id]
    _SEEN[request.request_id] = updates
    return updates


def _updates_of(engine: Engine, request_id: str) -> list:
    return _SEEN[request_id]


def test_a_full_conversation_keeps_answering_and_its_next_turn_reuses_the_kv():
    engine = Engine(FakeBackend(n_ctx=4096, n_ctx_seq=256, eog_after=8), coalesce_ms=0)
    history = [Message("user", "x" * 60), Message("assistant", "y" * 60)] * 3 + [Message("user", "next?")]
    first = _run(engine, Request("r1", "s", tuple(history), SamplingParams(max_tokens=32)))
    done = first[-1]
    assert done.done_reason is DoneReason.STOP and done.error is None
    assert done.dropped_messages >= 2 and done.prompt_total + headroom(256) <= 256
    # The app stops sending what was dropped; the next turn shares the trimmed prompt's KV.
    kept = history[done.dropped_messages:] + [Message("assistant", "z" * 8), Message("user", "more?")]
    second = _run(engine, Request("r2", "s", tuple(kept), SamplingParams(max_tokens=32)))[-1]
    assert second.done_reason is DoneReason.STOP and second.dropped_messages == 0
    assert second.cached_tokens >= done.prompt_total


@pytest.mark.slow
def test_the_real_model_keeps_answering_past_its_context():
    """SmolLM2 in a 512-token context, twelve turns of short questions: every turn answers,
    the overflowing ones say how many messages they dropped, and the turn after a trim reuses the
    trimmed prompt's KV (cached tokens reported)."""
    need_real_model()
    from backend.llama_backend import LlamaBackend

    backend = LlamaBackend.load(device="cpu", n_ctx=512, n_seq_max=4, n_batch=512, n_ubatch=512,
                                n_threads=1)
    try:
        engine = Engine(backend, coalesce_ms=0)
        history: list[Message] = []
        finals = []
        question = "Tell me one short fact about the number {}. Please be precise and brief."
        for turn in range(12):
            history.append(Message("user", question.format(turn)))
            done = _run(engine, Request(f"r{turn}", "s", tuple(history), SamplingParams(max_tokens=24)))[-1]
            assert done.error is None and done.done_reason in (DoneReason.STOP, DoneReason.LENGTH), done
            finals.append(done)
            history = history[done.dropped_messages:]  # what the app stops sending
            history.append(Message("assistant", "".join(u.text_delta for u in
                                                         _updates_of(engine, done.request_id))))
        trimmed = [i for i, f in enumerate(finals) if f.dropped_messages]
        assert trimmed, [f.prompt_total for f in finals]
        after = [finals[i + 1] for i in trimmed if i + 1 < len(finals) and not finals[i + 1].dropped_messages]
        assert after and all(f.cached_tokens > 0 for f in after), [(f.prompt_total, f.generated, f.cached_tokens, f.dropped_messages) for f in finals]
        assert all(f.prompt_total + f.generated <= 512 for f in finals)
    finally:
        backend.close()
