"""magnitude_tui/subagents.py on its own: names and the answer posted back to the parent (the
spawn flow end to end is in test_app_pilot.py, test_spawn_*)."""

from __future__ import annotations

from magnitude_tui.engine.events import SeqUpdate
from magnitude_tui.store import MessageRecord, PaneRecord
from magnitude_tui.subagents import answer_message, burst_tasks, next_name
from scheduler.types import DoneReason, Phase


def test_next_name_takes_the_lowest_number_no_open_pane_has():
    assert next_name("A", set()) == "A1"
    assert next_name("A", {"A1", "A3", "A3.1", "B7"}) == "A2"  # A2 was closed or renamed: free again
    assert next_name("A", {"A1", "A2", "A3", "research"}) == "A4"
    assert next_name("A3.", {"A3.1", "A3.2", "A3.x"}) == "A3.3"


def test_answer_message_carries_the_answer_or_why_there_is_none():
    child = PaneRecord("c1", "A1.2", "subagent", "p1", "find the bug")
    done = SeqUpdate("r", "c1", 0, Phase.DONE, done_reason=DoneReason.STOP)
    answer = answer_message(child, MessageRecord("assistant", "It is in step()."), done)
    assert answer.author == "A1.2" and answer.role == "user"
    assert answer.content == "Answer from subagent A1.2 (task: find the bug):\n\nIt is in step()."
    failed = SeqUpdate("r", "c1", None, Phase.DONE, done_reason=DoneReason.ERROR, error="worker died")
    assert answer_message(child, MessageRecord("assistant", "half"), failed).content.endswith(
        "ended without an answer: worker died")
    cancelled = SeqUpdate("r", "c1", None, Phase.DONE, done_reason=DoneReason.CANCELLED)
    assert answer_message(child, None, cancelled).content.endswith("ended without an answer: cancelled")


def test_burst_tasks_are_distinct():
    tasks = burst_tasks(8)
    assert len(set(tasks)) == 8 and tasks[0].startswith("Perspective 1 of 8")
