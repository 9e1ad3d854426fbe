"""Provides StopMatcher: finds stop strings in streamed text, across token boundaries, before it is shown."""

from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back what may be shown now.

    A stop string can arrive split over several tokens, so text that could still be the start of
    one is held back until the next delta decides. Once a stop string appears, the text before it
    is released and everything from it on is dropped for good.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.hit: str | None = None

    def feed(self, delta: str) -> str:
        if self.hit is not None or not delta:
            return ""
        if not self.stops:
            return delta
        text = self.held + delta
        cut = min(((i, s) for s in self.stops if (i := text.find(s)) >= 0), default=None)
        if cut is not None:
            self.hit = cut[1]
            self.held = ""
            return text[:cut[0]]
        keep = self._partial_len(text)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """The reply ended without a stop string: what was held back is ordinary text."""
        out, self.held = ("" if self.hit is not None else self.held), ""
        return out

    def _partial_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
