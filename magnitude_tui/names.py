"""Provides the one "first free name" rule: panes, subagents and HTTP conversations are named by it."""

from __future__ import annotations

import itertools
from typing import Callable, Container


def first_free(taken: Container[str], name: Callable[[int], str], start: int = 1) -> str:
    """The first of name(start), name(start + 1), ... that `taken` lacks."""
    return next(n for n in map(name, itertools.count(start)) if n not in taken)


def numbered(base: str, sep: str) -> Callable[[int], str]:
    """`base` itself for 1, then base + sep + "2", base + sep + "3", ...: a second one is numbered."""
    return lambda k: base if k == 1 else f"{base}{sep}{k}"
