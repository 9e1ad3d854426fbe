"""Reading a chat-completions event stream: comments, split data lines, usage, timings, errors."""

from __future__ import annotations

import asyncio

import pytest

from magnitude_tui.remote.stream import DONE, MalformedStream, ServerError, events


def read(*lines: str) -> list:
    async def source():
        for line in lines:
            yield line

    async def collect():
        return [item async for item in events(source())]

    return asyncio.run(collect())


def test_events_skip_comments_join_data_lines_and_stop_at_done():
    items = read(": ping", "", 'data: {"choices": [{"delta": {"content": "he"},', 'data:  "finish_reason": null}]}', "",
                 'data: {"choices": [{"delta": {}, "finish_reason": "stop"}], "timings": {"prompt_n": 5, '
                 '"prompt_ms": 10, "predicted_n": 2, "predicted_ms": 20, "cache_n": 4}}', "",
                 'data: {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, '
                 '"prompt_tokens_details": {"cached_tokens": 4}}}', "", "data: [DONE]", "", "data: ignored")
    first, last, usage, done = items
    assert first.text == "he" and first.finish_reason is None
    assert last.finish_reason == "stop" and last.timings.cache_n == 4 and last.timings.predicted_tok_s == 100.0
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens, usage.usage.cached_tokens) == (9, 2, 4)
    assert done is DONE


def test_a_last_event_without_its_blank_line_still_counts():
    [chunk] = read('data: {"choices": [{"delta": {"content": "x"}, "finish_reason": "length"}]}')
    assert chunk.text == "x" and chunk.finish_reason == "length"


@pytest.mark.parametrize("line, error, match", [
    ("data: {oops", MalformedStream, "not JSON"),
    ('data: {"object": "chunk"}', MalformedStream, "no 'choices' list"),
    ("garbage line", MalformedStream, "not a server-sent event line"),
    ('data: {"error": {"message": "context length exceeded"}}', ServerError, "context length exceeded"),
])
def test_what_is_not_a_stream_says_what_it_got(line, error, match):
    with pytest.raises(error, match=match):
        read(line, "")


def test_a_first_half_that_ends_the_stream_is_a_replacement_character():
    # Held for its other half, which never comes: said as U+FFFD before DONE, not dropped.
    items = read('data: {"choices":[{"delta":{"content":"ok \\ud83d"}}]}', "", "data: [DONE]", "")
    assert [i.text for i in items[:-1]] == ["ok ", "\ufffd"] and items[-1] is DONE


def test_a_lone_half_inside_one_event_is_a_replacement_character():
    items = read('data: {"choices":[{"delta":{"content":"a \\ud800 b"}}]}', "", "data: [DONE]", "")
    assert [i.text for i in items[:-1]] == ["a \ufffd b"] and items[-1] is DONE
