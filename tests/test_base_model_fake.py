"""A model without a chat template, on the fake backend: the load notice, replies that stop at the
ChatML fallback's markers written as text, and raw-completion requests that skip the template."""

from __future__ import annotations

from backend.fake import BOS, IM_START, FakeBackend
from backend.template_fallback import CHATML_MARKERS, INFO_NOTICE, INFO_TEMPLATE, TemplateSource, text_markers
from scheduler.types import DoneReason, ErrorKind, Request, SamplingParams
from tests.engine_driver import Driver, Seen, assert_clean, engine_for

# What a base model writes after its answer when it imitates a ChatML prompt it sees as text.
BASE_REPLY = "Hi there.<|im_end|>\n<|im_start|>user\nAnd then?"


def _raw(rid: str, session: str, prompt: str, max_tokens: int = 20, stop: tuple[str, ...] = ()) -> Request:
    return Request(rid, session, (), SamplingParams(max_tokens=max_tokens, stop=stop), prompt=prompt)


def _run(driver: Driver, request: Request) -> Seen:
    driver.seen.setdefault(request.request_id, Seen())
    driver.engine.submit(request)
    driver.run_until_done(request.request_id)
    return driver.seen[request.request_id]


def test_a_model_without_a_template_says_so_in_its_info():
    info = FakeBackend(base_model=True).info
    assert info[INFO_TEMPLATE] == TemplateSource.CHATML_FALLBACK.value
    assert "no chat template" in info[INFO_NOTICE] and "<|im_end|>" in info[INFO_NOTICE]
    assert "/raw" in info[INFO_NOTICE]  # and it names the way out
    assert INFO_NOTICE not in FakeBackend().info


def test_markers_without_a_token_of_their_own_become_stop_texts():
    assert text_markers(lambda m: [1] if m == "<|im_end|>" else [60, 124, 105]) == ("<|im_start|>",)
    assert text_markers(lambda m: [1]) == ()
    assert FakeBackend(base_model=True).chat_stops == CHATML_MARKERS


def test_a_chat_reply_stops_where_the_model_writes_the_end_marker_as_text():
    engine, _ = engine_for(FakeBackend(base_model=True, reply=BASE_REPLY))
    d = Driver(engine)
    d.submit("r", "s", "hello", max_tokens=200)
    d.run_until_done("r")
    seen = d.seen["r"]
    assert seen.last.done_reason is DoneReason.STOP
    assert seen.text == "Hi there."  # neither the marker nor the invented next turn is shown
    assert seen.last.generated <= len("Hi there.<|im_end|>")
    assert_clean(engine, "s")


def test_a_model_with_a_template_is_not_cut_at_marker_text():
    engine, _ = engine_for(FakeBackend(reply=BASE_REPLY))
    d = Driver(engine)
    d.submit("r", "s", "hello", max_tokens=len(BASE_REPLY))
    d.run_until_done("r")
    assert d.seen["r"].last.done_reason is DoneReason.LENGTH
    assert d.seen["r"].text == BASE_REPLY
    assert_clean(engine, "s")


def test_a_raw_prompt_is_text_without_the_template_with_bos():
    engine, backend = engine_for(FakeBackend(base_model=True, reply=BASE_REPLY))
    d = Driver(engine)
    prompt = "Once upon <|im_start|>system"
    seen = _run(d, _raw("r", "s", prompt, max_tokens=20))
    first = backend.decode_calls[0].slices[0].tokens
    assert first[0] == BOS and IM_START not in first  # typed markers stay text (parsing is off)
    assert seen.last.prompt_total == 1 + len(prompt)  # one fake token per character, no scaffolding
    # No template, so no template stops: the reply is the model's text, to the length limit.
    assert seen.last.done_reason is DoneReason.LENGTH and seen.text == BASE_REPLY[:20]
    assert_clean(engine, "s")


def test_a_raw_prompt_honours_its_own_stop_strings():
    engine, _ = engine_for(FakeBackend(reply=BASE_REPLY))
    d = Driver(engine)
    seen = _run(d, _raw("r", "s", "Say hi:", max_tokens=40, stop=("\n",)))
    assert seen.last.done_reason is DoneReason.STOP and seen.text == "Hi there.<|im_end|>"
    assert_clean(engine, "s")


def test_a_raw_follow_up_reuses_the_previous_turns_kv():
    engine, _ = engine_for(FakeBackend(reply="abc"))
    d = Driver(engine)
    first = _run(d, _raw("r1", "s", "Count: ", max_tokens=6))
    second = _run(d, _raw("r2", "s", "Count: " + first.text + " more", max_tokens=3))
    assert second.last.cached_tokens >= len("Count: ") + 1
    assert_clean(engine, "s")


def test_an_empty_raw_prompt_fails_alone():
    engine, _ = engine_for(FakeBackend())
    d = Driver(engine)
    seen = _run(d, _raw("r", "s", ""))
    assert seen.last.done_reason is DoneReason.ERROR and seen.last.error_kind is ErrorKind.INVALID
    assert "prompt is empty" in seen.last.error
    assert_clean(engine, "s")
