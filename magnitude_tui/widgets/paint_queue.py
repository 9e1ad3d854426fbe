"""Provides PaintQueue: a pane's ended replies and transcript notes, in the order they came, until
the next paint shows them (plain data: a pane's PaneReplies holds it, the pane's widgets among its
notes)."""

from __future__ import annotations

from typing import Generic, TypeVar

Ending = TypeVar("Ending")
Note = TypeVar("Note")


class PaintQueue(Generic[Ending, Note]):
    """Ended replies and notes (a context note, an agent's tool block) waiting for the paint tick.
    A note goes after the replies that ended before it came and before the rest, however late the
    tick: a tool's block shows under the text that called it."""

    def __init__(self) -> None:
        self._endings: list[Ending] = []
        self._notes: list[tuple[int, Note]] = []  # (how many endings came before it, the note)

    @property
    def has_endings(self) -> bool:
        return bool(self._endings)

    def end(self, ending: Ending) -> None:
        self._endings.append(ending)

    def note(self, note: Note) -> None:
        self._notes.append((len(self._endings), note))

    def take(self) -> tuple[list[tuple[list[Note], Ending]], list[Note]]:
        """Everything waiting, emptied: each ending with the notes that came just before it, then
        the notes that came after the last ending."""
        endings, notes = self._endings, self._notes
        self._endings, self._notes = [], []
        return ([([n for at, n in notes if at == i], e) for i, e in enumerate(endings)],
                [n for at, n in notes if at >= len(endings)])
