"""Provides ReplyText: a sequence's sampled tokens turned into the text its user may see; and encodable_text."""

from __future__ import annotations

import re

from backend.protocol import Detokenizer

# UTF-16 halves in a str: a remote server's JSON escapes (a character cut between two events
# arrives as `\ud83d`, then `\ude00`), or os.listdir's stand-ins for bytes that are not UTF-8.
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable_text(text: str) -> str:
    """`text` as UTF-8 can hold it: each pair of halves joined into its character, each lone half
    shown as U+FFFD (as a UTF-8 reader shows a byte it cannot read), the rest as it is. A str with
    a lone half cannot be encoded: saving it, or sending it back to a server, raised."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class ReplyText:
    """Incremental text of one reply, with stop strings matched across token boundaries.

    A stop string can arrive split over several tokens ("<|", "end", "|>"), so text that could be
    the start of one is held back until the next token decides: either the stop string completes
    (the reply ends; the stop string and whatever came after it in that token are dropped) or it
    cannot anymore (the held text is released). The user therefore never sees a stop string, and
    text lags by at most the longest stop string minus one character.

    Text written under a grammar (a response schema) or inside a tool call is not matched: the
    grammar or the call decides where that text ends, and a cut would leave JSON that does not parse.
    """

    def __init__(self, detok: Detokenizer, stop: tuple[str, ...] = ()) -> None:
        self._detok = detok
        self._stop = tuple(stop)
        self._held = ""
        self.stopped = False  # a stop string matched: the reply is over

    def feed(self, token: int, match_stops: bool = True) -> str:
        """The text this token makes visible (possibly empty); `match_stops` False: the token was
        written under a grammar or inside a call, so it (and text held back before it) is released as is."""
        if self.stopped:
            return ""
        text = self._detok.feed(token)
        if not self._stop:
            return text
        buf = self._held + text
        if not match_stops:
            self._held = ""
            return buf
        hits = [i for i in (buf.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped, self._held = True, ""
            return buf[:min(hits)]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """The reply ended for another reason: release held text. A character whose bytes were
        cut off by the end is dropped rather than shown as U+FFFD."""
        tail = "" if self.stopped else self._detok.flush()
        held, self._held = self._held, ""
        return held + tail

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest end of `buf` that is the beginning of some stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:k]):
                    best = k
                    break
        return best
