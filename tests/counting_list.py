"""A token list that counts the tokens read from it, for tests that a step reads only what is new."""

from __future__ import annotations


class CountingList(list):
    """A prompt that counts the tokens read from it (indexing, slicing, iterating, joining)."""

    reads = 0

    def __getitem__(self, index):
        got = super().__getitem__(index)
        CountingList.reads += len(got) if isinstance(index, slice) else 1
        return got

    def __iter__(self):
        CountingList.reads += len(self)
        return super().__iter__()

    def __add__(self, other):
        CountingList.reads += len(self)
        return list(super().__iter__()) + list(other)
