"""n-gram lookup follows the copy it is making: it goes on from the place it copies (not the
latest occurrence of its last n-gram), and after an established copy breaks (a renamed
identifier) it resumes just after the break as soon as the reply does."""

from __future__ import annotations

from backend.fake import FakeBackend
from scheduler.drafts import DraftKind
from scheduler.ngram import COPY_RUN, RESYNC_SPAN, NgramIndex, NgramSource
from tests.engine_driver import assert_clean, by_request, chat, engine_for, text


def index(tokens):
    ix = NgramIndex()
    ix.extend(tokens)
    return ix


def test_a_copy_goes_on_from_its_own_place_when_a_later_line_shares_its_last_ngram():
    # Two "lines" share the 4-gram 1 2 3 4; the reply copies the first line.
    prompt = [10, 1, 2, 3, 4, 20, 21, 22, 11, 1, 2, 3, 4, 30, 31, 32, 12]
    ix = index(prompt + [10, 1, 2, 3])
    assert ix.lookup(4) == [4, 20, 21, 22]  # only the first line follows (10, 1, 2, 3)
    ix.extend([4])
    # The latest (1, 2, 3, 4) is the second line's; the copy being made is the first line.
    assert ix._latest() == (13, 4)
    assert ix.lookup(4) == [20, 21, 22, 11]
    ix.extend([20, 21])
    assert ix.lookup(3) == [22, 11, 1]


def test_a_copy_that_broke_at_a_renamed_token_resumes_as_soon_as_the_reply_does():
    prompt = list(range(1, 13))  # 1 .. 12
    ix = index(prompt + [0, 1, 2])
    assert ix.lookup(4) == [3, 4, 5, 6]
    ix.extend([3, 4, 5, 99])  # the copy ran, then 99 stands where the prompt has 6
    assert ix.lookup(4) == []  # nothing follows (5, 99) anywhere yet
    ix.extend([7])
    # (99, 7) never occurred and a single token is no n-gram match; just after the break it is.
    assert ix._latest() is None
    assert ix.lookup(4) == [8, 9, 10, 11]
    ix.extend([8, 9, 10])
    assert ix.lookup(4) == [11, 12, 0, 1]  # and the resumed copy is followed on


def test_a_rename_of_several_tokens_resumes_at_the_longest_match_after_the_break():
    prompt = [50, 1, 2, 3, 4, 5, 60, 61, 7, 8, 9, 7, 10, 11, 12]
    ix = index(prompt + [0, 50, 1, 2, 3, 4, 5, 70, 71, 72, 9, 7])
    # After the break at 60, (9, 7) matches the prompt's 9 7 right after it, ahead of the lone 7s.
    assert ix.lookup(3) == [10, 11, 12]


def test_a_chance_match_that_broke_at_once_is_not_resumed():
    # Prose: a 2-gram matched, its guess was wrong at the first token; the reply's next token
    # happens to follow shortly after that place. No copy was established, so no resumption.
    prompt = [40, 41, 42, 43, 44, 45, 46]
    ix = index(prompt + [0, 40, 41])
    assert ix.lookup(4) == [42, 43, 44, 45]
    assert COPY_RUN > 2  # the copy ran its 2-gram and none of its guess: not established
    ix.extend([77, 44])
    assert ix.lookup(4) == []


def test_resumption_is_given_up_once_the_reply_wrote_more_than_the_span_since_the_break():
    prompt = list(range(1, 30))
    ix = index(prompt + [0, 1, 2])
    assert ix.lookup(4) == [3, 4, 5, 6]
    ix.extend([3, 4, 5] + [100 + i for i in range(RESYNC_SPAN)])
    assert ix.lookup(2) == []
    ix.extend([7])
    assert ix.lookup(2) == []  # 7 follows the break closely, but the reply has moved on


class LatestOnly(NgramSource):
    """The lookup without following a copy: the latest occurrence of the longest suffix, each step."""

    def propose(self, key, tokens, k):
        if k <= 0:
            return []
        ix = self._synced(key, tokens)
        found = ix._latest()
        return [] if found is None else ix.tokens[found[0]:found[0] + k]


CODE = ("def add(self, shelf):\n    self.shelves[shelf] += 1\n"
        "def drop(self, shelf):\n    self.shelves[shelf] -= 1\n"
        "def size(self, shelf):\n    return len(self.shelves[shelf])\n")


def run_ngram(source, spec="ngram"):
    """One sequence on the fake backend whose reply is CODE with `shelves` renamed `racks`, the
    prompt CODE itself (one character a token)."""
    reply = CODE.replace("shelves", "racks")
    backend = FakeBackend(reply=reply, eog_after=len(reply))
    engine, _ = engine_for(backend, spec=spec, drafts={DraftKind.NGRAM: source})
    engine.submit(chat("r", "s", CODE, max_tokens=len(reply) + 4))
    reports = []
    while engine.has_work():
        r = engine.step()
        if r is not None:
            reports.append(r)
    ups = by_request(reports)["r"]
    assert_clean(engine, "s")
    return text(ups), sum(r.draft_accepted for r in reports), sum(1 for r in reports if r.decode_rows)


def test_following_the_copy_accepts_more_of_a_renamed_rewrite_than_the_latest_occurrence_does():
    off_text, _, off_steps = run_ngram(NgramSource(), spec="off")
    new_text, new_accepted, new_steps = run_ngram(NgramSource())
    old_text, old_accepted, old_steps = run_ngram(LatestOnly())
    assert new_text == old_text == off_text == CODE.replace("shelves", "racks")
    assert new_accepted > old_accepted and new_steps < old_steps < off_steps


def test_a_one_token_match_that_recurs_after_the_break_waits_for_a_second_token():
    # After the break at 60 the reply writes 9: it occurs twice just after the break, so where
    # the copy resumes is not known yet; once the reply writes 9 5, it is: at the nearest 9 5,
    # not the latest one, which the n-gram index would take.
    prompt = [50, 1, 2, 3, 4, 5, 60, 9, 6, 7, 9, 5, 8, 11, 12, 20, 9, 5, 40, 41]
    ix = index(prompt + [0, 50, 1, 2, 3])
    assert ix.lookup(3) == [4, 5, 60]
    ix.extend([4, 5, 70, 9])
    assert ix.lookup(3) == []
    ix.extend([5])
    assert ix._latest() == (18, 2)
    assert ix.lookup(3) == [8, 11, 12]
