"""Provides the three tasks of `bench spec`: rewriting code (the reply copies its prompt), quoting a
passage (it copies pieces), and open chat (it copies nothing)."""

from __future__ import annotations

from enum import Enum

from magnitude_bench.common import PASSAGE as COMMON_PASSAGE
from scheduler.types import Message

# About 400 tokens of ordinary Python; the repetitive task renames one identifier in it, so a
# faithful reply is the prompt again with a few tokens changed.
CODE_BLOCK = '''\
import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Inventory:
    """Items in a warehouse, counted per shelf."""

    shelves: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, shelf: str, item: str, count: int = 1) -> None:
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        items = self.shelves.setdefault(shelf, {})
        items[item] = items.get(item, 0) + count

    def remove(self, shelf: str, item: str, count: int = 1) -> None:
        items = self.shelves.get(shelf, {})
        have = items.get(item, 0)
        if have < count:
            raise KeyError(f"only {have} of {item} on shelf {shelf}")
        items[item] = have - count
        if items[item] == 0:
            del items[item]

    def total(self, item: str) -> int:
        return sum(items.get(item, 0) for items in self.shelves.values())

    def shelves_with(self, item: str) -> list[str]:
        return sorted(shelf for shelf, items in self.shelves.items() if item in items)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.shelves, indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        return cls(json.loads(path.read_text()))


def restock(inventory: Inventory, orders: list[tuple[str, str, int]]) -> int:
    added = 0
    for shelf, item, count in orders:
        inventory.add(shelf, item, count)
        added += count
    return added
'''

# Identifiers renamed, one per sequence, so that no two prompts are the same.
RENAMES = [("shelves", "racks"), ("items", "goods"), ("count", "amount"), ("inventory", "stock"),
           ("restock", "replenish"), ("added", "total_added"), ("have", "on_hand"), ("shelf", "bay")]

PASSAGE = COMMON_PASSAGE.rstrip()  # the passage the quoting task quotes from

QUESTIONS = ["What did the children do?", "What did the old maps show?", "When did travellers come?",
             "What did the keeper do every evening?", "What did the baker do?",
             "What happened in winter?", "Where did the river meet the sea?", "What did the gulls do?"]

CHATS = ["Tell me a short story about a robot who learns to paint.", "What makes a good cup of tea?",
         "Describe a walk through a forest in autumn.", "Give me three ideas for a rainy weekend.",
         "Why do cats like boxes?", "Write a few lines about the sea at night.",
         "How would you explain gravity to a child?", "What is your favourite season and why?"]


class Task(str, Enum):
    REPETITIVE = "repetitive"  # rewrite a code block with one identifier renamed
    QUOTING = "quoting"  # answer with quotes from a passage
    CHAT = "chat"  # open conversation

    @property
    def reply_tokens(self) -> int:
        """The longest reply `bench spec` lets this task write unless --max-tokens says otherwise: room
        for the reply the task asks for, which the model ends itself (EOS). The rewrite is the ~400-token
        block again (greedy replies of SmolLM2-135M end at 225-406 tokens); a quote ends at 17-54; open
        chat never ends on its own, so it stops at a chat turn's length."""
        return _REPLY_TOKENS[self]


_REPLY_TOKENS = {Task.REPETITIVE: 512, Task.QUOTING: 96, Task.CHAT: 64}


def task_messages(task: Task, i: int) -> tuple[Message, ...]:
    """Sequence i's prompt for a task (each sequence gets a different variant)."""
    if task is Task.REPETITIVE:
        old, new = RENAMES[i % len(RENAMES)]
        return (Message("user", f"Rewrite this code with `{old}` renamed to `{new}`. Reply with the whole "
                                f"code only.\n\n```python\n{CODE_BLOCK}```"),)
    if task is Task.QUOTING:
        question = QUESTIONS[i % len(QUESTIONS)]
        return (Message("user", f"Passage:\n\n{PASSAGE}\n\nAnswer by quoting the passage word for word, "
                                f"sentence by sentence: {question}"),)
    return (Message("user", CHATS[i % len(CHATS)]),)
