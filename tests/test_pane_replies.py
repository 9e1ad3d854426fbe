"""A pane's reply state machine (magnitude_tui/pane_replies.py) without an app: engine updates
become one reply record per request, `done` completes it, late updates change nothing, a refused
request records no reply (and says when its message alone is too long), a drop is noted once per
request, and what waits for the paint comes out in the order it came."""

from __future__ import annotations

import subprocess
import sys

from magnitude_tui.conversation import Conversation
from magnitude_tui.engine.events import RemoteFacts, SeqUpdate
from magnitude_tui.pane_replies import PaneReplies
from magnitude_tui.records import MessageRecord, PaneRecord
from scheduler.types import DoneReason, ErrorKind, Phase, ToolCall


def _replies(*texts: str) -> PaneReplies[str]:
    """A pane whose conversation holds a user message and its answer for each text, then one
    unanswered user message ("ask")."""
    records = [r for t in texts for r in (MessageRecord("user", t), MessageRecord("assistant", f"re {t}"))]
    return PaneReplies(Conversation(PaneRecord("p1", "A1", messages=[*records, MessageRecord("user", "ask")])))


def _update(request_id: str, phase: Phase = Phase.GENERATING, **kw) -> SeqUpdate:
    return SeqUpdate(request_id, "p1", 0, phase, **kw)


def _done(request_id: str, **kw) -> SeqUpdate:
    return _update(request_id, Phase.DONE, **kw)


def test_the_pane_replies_load_no_textual() -> None:
    code = "import sys, magnitude_tui.pane_replies; print('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_text_deltas_accumulate_into_one_reply_record_and_done_completes_it() -> None:
    r = _replies()
    r.begin_request("r1")
    assert r.busy and r.streaming is None
    assert r.apply(_update("r1", Phase.PREFILL))
    assert r.streaming is None and len(r.chat.messages) == 1  # no text yet: no reply record
    assert r.apply(_update("r1", text_delta="Hel")) and r.apply(_update("r1", text_delta="lo"))
    reply = r.streaming
    assert reply is not None and r.chat.messages[-1] is reply.message and len(r.chat.messages) == 2
    assert reply.message.content == "Hello" and not reply.message.complete and r.is_streaming(reply.message)
    assert reply.take_text() == "Hello" and reply.take_text() == ""  # painted: nothing pending
    done = _done("r1", text_delta="!", done_reason=DoneReason.LENGTH)
    assert r.apply(done)
    assert not r.busy and r.streaming is None and r.has_ended and r.last_update is done
    assert reply.message.content == "Hello!" and reply.message.complete and reply.message.done_reason == "length"
    assert reply.take_text() == "!"  # the last piece waits for the paint like the others
    assert r.chat.take_unsaved() == [reply.message]
    (([], ending),), after = r.take()
    assert ending.reply is reply and ending.update is done and not ending.told and ending.error_note is None
    assert after == [] and not r.has_ended


def test_done_without_a_reason_completes_the_reply_as_stopped() -> None:
    r = _replies()
    r.begin_request("r1")
    r.apply(_update("r1", text_delta="hi"))
    r.apply(_done("r1"))
    assert r.chat.messages[-1].done_reason == DoneReason.STOP.value


def test_a_late_update_for_an_earlier_request_changes_nothing() -> None:
    r = _replies()
    r.begin_request("old")
    r.apply(_update("old", text_delta="first"))
    r.apply(_done("old"))
    r.take()
    r.begin_request("new")
    current = _update("new", Phase.PREFILL, prompt_total=40)
    r.apply(current)
    assert not r.apply(_update("old", text_delta=" more"))
    assert not r.apply(_done("old", dropped_messages=2))
    assert r.busy and r.request_id == "new" and r.last_update is current and r.streaming is None
    assert r.chat.messages[-1].content == "first" and not r.has_ended
    assert r.take() == ([], [])  # no note, no ending


def test_a_new_request_starts_a_new_reply_while_the_last_ending_waits_for_its_paint() -> None:
    r = _replies()
    r.begin_request("r1")
    r.apply(_update("r1", text_delta="one"))
    r.apply(_done("r1"))
    r.begin_request("r2")
    r.apply(_update("r2", text_delta="two"))
    (([], ending),), _ = r.take()
    assert ending.reply is not None and ending.reply.message.content == "one"
    assert r.streaming is not None and r.streaming.message.content == "two"
    assert [m.content for m in r.chat.messages[-2:]] == ["one", "two"]


def test_a_request_refused_as_too_long_records_no_reply_and_says_why() -> None:
    r = _replies()
    r.context_size = 4096
    r.begin_request("r1")
    refused = _done("r1", done_reason=DoneReason.ERROR, error_kind=ErrorKind.CONTEXT_LENGTH,
                    error="prompt too long", prompt_total=5000)
    r.apply(refused)
    assert not r.busy and [m.role for m in r.chat.messages] == ["user"]
    ((notes, ending),), after = r.take()
    assert ending.reply is None and ending.told  # the note says it: no toast as well
    assert ending.error_note == "error: prompt too long"
    (note,) = notes
    assert note.startswith("not sent: this message does not fit the context even alone")
    assert "5,000 tokens" in note and "the context holds 4,096" in note and note.endswith("(--n-ctx)")
    assert after == []


def test_a_remote_refusal_does_not_name_the_local_option() -> None:
    r = _replies()
    r.begin_request("r1")
    r.apply(_done("r1", done_reason=DoneReason.ERROR, error_kind=ErrorKind.CONTEXT_LENGTH, error="too long",
                  remote=RemoteFacts(endpoint="http://server")))
    ((notes, _),), _ = r.take()
    assert notes and "(--n-ctx)" not in notes[0]


def test_a_request_that_failed_otherwise_leaves_the_telling_to_the_pane() -> None:
    r = _replies()
    r.begin_request("r1")
    r.apply(_done("r1", done_reason=DoneReason.ERROR, error_kind=ErrorKind.FAILED, error="backend died"))
    ((notes, ending),), _ = r.take()
    assert notes == [] and ending.reply is None and not ending.told
    assert ending.error_note == "error: backend died"


def test_dropped_messages_are_noted_once_per_request() -> None:
    r = _replies("one", "two")  # two answered turns, then "ask"
    r.begin_request("r1")
    r.apply(_update("r1", Phase.PREFILL, dropped_messages=2))
    r.apply(_update("r1", text_delta="a", dropped_messages=2))
    r.apply(_done("r1", dropped_messages=2))
    ((notes, _),), _ = r.take()
    (note,) = notes
    assert "the oldest 1 turn (2 messages)" in note
    assert [m.content for m in r.chat.messages if r.chat.is_dropped(m)] == ["one", "re one"]
    r.begin_request("r2")  # the next request that drops is noted again
    r.apply(_update("r2", Phase.PREFILL, dropped_messages=2))
    r.apply(_update("r2", Phase.PREFILL, dropped_messages=2))
    assert len(r.take()[1]) == 1


def test_a_refused_request_drops_nothing() -> None:
    r = _replies("one", "two")
    r.begin_request("r1")
    r.apply(_done("r1", done_reason=DoneReason.ERROR, error_kind=ErrorKind.CONTEXT_LENGTH, error="too long",
                  dropped_messages=2))
    assert not any(r.chat.is_dropped(m) for m in r.chat.messages)
    ((notes, ending),), _ = r.take()
    assert notes == [] and not ending.told  # a longer conversation's refusal keeps the engine's words


def test_answers_a_retry_carried_join_the_next_reply_as_its_others() -> None:
    r = _replies()
    r.carried = ["first answer", "second answer"]
    r.begin_request("r1")
    r.apply(_update("r1", text_delta="third answer"))
    reply = r.chat.messages[-1]
    assert r.carried == []
    assert reply.answers == ["first answer", "second answer", "third answer"] and reply.shown == 2
    r.apply(_done("r1"))
    r.begin_request("r2")
    r.apply(_update("r2", text_delta="later"))
    assert r.chat.messages[-1].others == []  # carried once only


def test_a_request_that_wrote_no_text_keeps_its_carried_answers() -> None:
    r = _replies()
    r.carried = ["kept"]
    r.begin_request("r1")
    r.apply(_done("r1", done_reason=DoneReason.CANCELLED))
    assert r.carried == ["kept"]  # the workspace gives them back (turns.py)


def test_a_tool_turn_joins_the_reply_its_request_wrote() -> None:
    r = _replies()
    r.begin_request("r1")
    r.apply(_update("r1", text_delta="reading it"))
    r.apply(_done("r1"))
    call = ToolCall("c1", "read_file", '{"path": "a"}')
    r.chat.add_tool_turn((call,))
    assert r.chat.messages[-1].content == "reading it" and r.chat.messages[-1].tool_calls == (call,)


def test_notes_come_out_after_the_endings_before_them() -> None:
    r = _replies()
    r.note("before")
    r.begin_request("r1")
    r.apply(_update("r1", text_delta="x"))
    r.apply(_done("r1"))
    r.note("after")
    ((notes, ending),), after = r.take()
    assert notes == ["before"] and ending.reply is not None and after == ["after"]


def test_a_subagents_answer_waits_until_the_reply_is_painted() -> None:
    r = _replies()
    answer = MessageRecord("user", "sub says", author="A1.1")
    own = MessageRecord("user", "mine")
    assert not r.hold(answer)  # nothing runs: it goes in at once
    r.begin_request("r1")
    assert not r.hold(own)  # only a subagent's answer waits
    assert r.hold(answer)
    assert r.take_held() == []  # still replying
    r.apply(_done("r1"))
    assert r.take_held() == []  # ended, not painted yet
    r.take()
    assert r.take_held() == [answer] and r.take_held() == []


def test_what_the_sequence_holds_and_an_unanswered_prompt() -> None:
    r = _replies()
    assert r.context_used is None and r.unanswered_prompt() is r.chat.messages[-1]
    r.begin_request("r1")
    assert r.unanswered_prompt() is None  # its reply is on its way
    r.apply(_update("r1", text_delta="a", prompt_total=120, generated=5))
    assert r.context_used == 125
    r.apply(_done("r1", prompt_total=120, generated=7))
    assert r.context_used == 127 and r.unanswered_prompt() is None
