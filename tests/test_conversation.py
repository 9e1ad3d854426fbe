"""A pane's conversation bookkeeping (magnitude_tui/conversation.py) and the order its paint shows
endings and notes in (widgets/paint_queue.py), without an app: what is sent after the engine
dropped the oldest turns, a tool turn's call with its result, what is left to save, and when a
refused prompt is the new message's fault alone."""

from __future__ import annotations

import subprocess
import sys

from magnitude_tui.agents import AgentSettings
from magnitude_tui.conversation import Conversation
from magnitude_tui.records import NOT_RUN, MessageRecord, PaneRecord
from magnitude_tui.widgets.paint_queue import PaintQueue
from scheduler.types import ToolCall


def _turns(*texts: str) -> list[MessageRecord]:
    """A user message and its answer for each text."""
    return [r for t in texts for r in (MessageRecord("user", t), MessageRecord("assistant", f"re {t}"))]


def _chat(*texts: str, system: str = "") -> Conversation:
    return Conversation(PaneRecord("p1", "A1", messages=_turns(*texts), settings=AgentSettings(system=system)))


def test_neither_textual_nor_llama_cpp_is_loaded() -> None:
    code = ("import sys, magnitude_tui.conversation, magnitude_tui.widgets.paint_queue; "
            "print(sorted({'textual', 'llama_cpp'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_after_a_drop_the_oldest_turns_are_not_sent_and_the_note_counts_them() -> None:
    chat = _chat("one", "two", "three", system="be brief")
    chat.append(MessageRecord("user", "four"))
    chat.begin_request()
    note = chat.drop_oldest(4)  # the engine left out two turns after the system prompt
    assert "the oldest 2 turns (4 messages)" in note
    assert [m.content for m in chat.messages if chat.is_dropped(m)] == ["one", "re one", "two", "re two"]
    sent = chat.to_send()
    assert [m.content for m in sent] == ["be brief", "three", "re three", "four"]
    assert chat.raw_text() == "threere threefour"


def test_a_refused_prompt_blames_the_message_only_when_it_was_sent_alone() -> None:
    chat = _chat("one", "two", system="be brief")
    chat.append(MessageRecord("user", "a long paste"))
    chat.begin_request()
    note = chat.too_long_note(4, 9_687, 8_192, local=True)  # the engine left out both turns before it
    assert note is not None and "this message does not fit the context" in note
    assert "9,687 tokens with the system prompt; the context holds 8,192" in note and "(--n-ctx)" in note
    assert chat.too_long_note(2, 9_687, 8_192, local=True) is None  # a turn was still before it
    alone = _chat()
    alone.append(MessageRecord("user", "a long paste"))
    alone.begin_request()
    assert alone.too_long_note(0, 0, None, local=False) == (
        "not sent: this message does not fit the context even alone; shorten or split it, or use a larger context")


def test_a_streaming_reply_can_be_left_out_of_what_is_sent() -> None:
    chat = _chat("one")
    chat.append(MessageRecord("user", "two"))
    reply = chat.start_reply(["an earlier answer"])
    reply.content = "partial"
    assert reply.answers == ["an earlier answer", "partial"] and not reply.complete
    assert [m.content for m in chat.to_send(leave_out=reply, with_system=False)] == ["one", "re one", "two"]
    assert chat.to_send()[-1].content == "partial"


def test_a_tool_turn_joins_its_reply_and_its_result_answers_the_call() -> None:
    chat = _chat("one")
    chat.append(MessageRecord("user", "read a.txt"))
    chat.begin_request()
    chat.start_reply([]).content = "reading it"
    call = ToolCall("c1", "read_file", '{"path": "a.txt"}')
    chat.add_tool_turn((call,))
    chat.append(MessageRecord("tool", "hello", call=call))
    *_, turn, result = chat.to_send()
    assert (turn.role, turn.content, turn.tool_calls) == ("assistant", "reading it", (call,))
    assert (result.role, result.tool_call_id, result.name, result.content) == ("tool", "c1", "read_file", "hello")


def test_a_turn_with_no_text_gets_a_reply_of_its_own_and_an_unanswered_call_is_answered_not_run() -> None:
    chat = _chat()
    chat.append(MessageRecord("user", "go"))
    chat.begin_request()
    chat.add_tool_turn((ToolCall("c1", "run", "{}"),))
    assert chat.messages[-1].calls_only
    assert chat.to_send()[-1].content == NOT_RUN  # the agent was stopped before it ran


def test_unsaved_records_come_once_in_creation_order_and_removed_ones_not_at_all() -> None:
    interrupted = MessageRecord("assistant", "cut", complete=False)
    chat = Conversation(PaneRecord("p1", "A1", messages=[MessageRecord("user", "a"), interrupted]))
    assert interrupted.done_reason == "interrupted"
    first, second = MessageRecord("user", "b"), MessageRecord("user", "c")
    chat.append(first)
    chat.mark_unsaved(interrupted)  # changed again: still one entry, in its first place
    chat.append(second)
    assert chat.withdraw_last_prompt() is second
    assert chat.take_unsaved() == [interrupted, first]
    assert chat.take_unsaved() == []
    assert [m.content for m in chat.truncate(interrupted, keep=True)] == ["b"]


def test_prompts_and_answers_are_the_users_own() -> None:
    chat = _chat("one")
    chat.append(MessageRecord("user", "a subagent's answer", author="B1"))
    assert chat.last_prompt().content == "one"
    assert chat.unanswered_prompt() is None and chat.withdraw_last_prompt() is None
    assert chat.last_reply() is None and chat.last_answer() == "re one"


def test_notes_are_painted_between_the_endings_they_came_between() -> None:
    queue: PaintQueue[str, str] = PaintQueue()
    queue.note("before both")
    queue.end("reply 1")
    queue.note("after reply 1")
    queue.note("also after reply 1")
    queue.end("reply 2")
    queue.note("after reply 2")
    assert queue.has_endings
    assert queue.take() == ([(["before both"], "reply 1"), (["after reply 1", "also after reply 1"], "reply 2")],
                            ["after reply 2"])
    assert not queue.has_endings and queue.take() == ([], [])
