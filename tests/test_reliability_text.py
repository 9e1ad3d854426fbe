"""What the user reads: stop strings across token boundaries, UTF-8 that survives every cut, and a
cancel at every point of a reply's life (fake backend: one token per character)."""

from __future__ import annotations

import pytest

from backend.fake import DEFAULT_REPLY, FakeBackend, FakeDetokenizer
from magnitude_tui.engine.text import ReplyText
from scheduler.types import DoneReason, Message, Phase, Request, SamplingParams
from tests.engine_driver import assert_clean, by_request, engine_for, text


def _feed(stream: ReplyText, s: str) -> list[str]:
    return [stream.feed(ord(c)) for c in s]


def test_a_stop_string_split_over_tokens_is_never_shown_and_nothing_after_it_is_kept():
    stream = ReplyText(FakeDetokenizer(), ("<|END|>",))
    pieces = _feed(stream, "Hi <|EN") + _feed(stream, "D|>tail")
    assert "".join(pieces) == "Hi " and stream.stopped
    assert pieces[3:7] == ["", "", "", ""]  # "<|EN" held back while it could still be the stop
    assert stream.flush() == ""


def test_text_that_only_looked_like_a_stop_string_is_released():
    stream = ReplyText(FakeDetokenizer(), ("<|END|>",))
    out = "".join(_feed(stream, "a <|EN no"))
    assert out == "a <|EN no" and not stream.stopped
    held = "".join(_feed(stream, " <|E"))
    assert held == " " and stream.flush() == "<|E"  # the reply ended another way: show all of it


def test_the_earliest_of_several_stop_strings_wins():
    stream = ReplyText(FakeDetokenizer(), ("world", "lo w"))
    assert "".join(_feed(stream, "hello world")) == "hel" and stream.stopped


@pytest.mark.parametrize("stop", ["fox", "quick brown", "T", " lazy dog. The"])
def test_the_engine_ends_a_reply_at_its_stop_string(stop):
    engine, _ = engine_for()
    engine.submit(Request("r", "s", (Message("user", "go"),), SamplingParams(max_tokens=200, stop=(stop,))))
    engine.submit(Request("other", "o", (Message("user", "go"),), SamplingParams(max_tokens=50)))
    ups = by_request(engine.run_until_idle())
    reply = DEFAULT_REPLY * 5
    assert text(ups["r"]) == reply[:reply.index(stop)]
    assert ups["r"][-1].done_reason is DoneReason.STOP
    assert text(ups["other"]) == reply[:50]  # its neighbour had no stop strings
    assert_clean(engine, "s", "o")


def test_a_cancel_releases_text_held_for_a_possible_stop_string():
    engine, _ = engine_for()
    engine.submit(Request("r", "s", (Message("user", "go"),), SamplingParams(max_tokens=200, stop=("The quick brown fox!",))))
    reports = [engine.step() for _ in range(12)]
    engine.cancel("r")
    reports += engine.run_until_idle()
    ups = by_request([r for r in reports if r])["r"]
    assert ups[-1].done_reason is DoneReason.CANCELLED
    assert text(ups) == DEFAULT_REPLY[:ups[-1].generated]
    assert_clean(engine, "s")


UNICODE = "👩‍👩‍👧 漢字かな e\u0301 ñ 🇺🇳 "


@pytest.mark.parametrize("max_tokens", range(1, len(UNICODE) + 1))
def test_zwj_emoji_cjk_and_combining_marks_arrive_intact_at_every_cut(max_tokens):
    engine, _ = engine_for(FakeBackend(reply=UNICODE, n_vocab=0x110000))
    engine.submit(Request("r", "s", (Message("user", "漢字 👩‍👩‍👧 e\u0301"),), SamplingParams(max_tokens=max_tokens)))
    ups = by_request(engine.run_until_idle())["r"]
    assert text(ups) == UNICODE[:max_tokens] and "\ufffd" not in text(ups)
    assert_clean(engine, "s")


def _submit_pair(engine) -> None:
    engine.submit(Request("r", "s", (Message("user", "a prompt of some length"),), SamplingParams(max_tokens=6)))
    engine.submit(Request("n", "t", (Message("user", "a neighbour"),), SamplingParams(max_tokens=6)))


def _steps_to_finish() -> int:
    engine, _ = engine_for(policy="fixed:8")
    _submit_pair(engine)
    return len(engine.run_until_idle())


@pytest.mark.parametrize("when", range(_steps_to_finish() + 1))
def test_a_cancel_at_every_point_ends_the_request_once_and_leaks_nothing(when):
    # fixed:8 makes the prompt take several steps: the cancel lands while preparing, in each
    # prefill chunk, at the first token, mid-generation, at the final step and after the end.
    engine, backend = engine_for(policy="fixed:8")
    _submit_pair(engine)
    reports = [engine.step() for _ in range(when)]
    engine.cancel("r")
    reports += engine.run_until_idle()
    ups = by_request([r for r in reports if r])["r"]
    assert [u.phase for u in ups].count(Phase.DONE) == 1 and ups[-1].phase is Phase.DONE
    assert ups[-1].done_reason in (DoneReason.CANCELLED, DoneReason.LENGTH)
    assert text(ups) == DEFAULT_REPLY[:ups[-1].generated]
    assert by_request([r for r in reports if r])["n"][-1].done_reason is DoneReason.LENGTH
    # The conversation keeps exactly its committed rows; nothing staged by the cancelled step.
    for session in engine.scheduler.sessions.values():
        assert backend.kv_tokens(session.seq_id) == session.tokens
    assert_clean(engine, "s", "t")
