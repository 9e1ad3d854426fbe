"""bench spec's acceptance trace: n-gram lookup judged at every position of each finished reply, and
a replay that proposes the guess made at the simulated sequence's own position, so a simulated GPU
drafting full windows sees what the lookup would have offered it, not the guesses a CPU run's
policy happened to ask for."""

from __future__ import annotations

import pytest

from backend.fake import FakeBackend
from magnitude_bench.spec_trace import Guess, RecordingSource, Reply, TraceDrafts
from scheduler.drafts import DraftKind
from scheduler.ngram import NgramSource
from scheduler.sequence import TokenView
from scheduler.speculation import K_MAX

BLOCK = list(range(100, 140))
PROMPT = [1, 2] + BLOCK + [3]
REPLY = BLOCK[:12] + [77] + BLOCK[13:36]  # the block copied, one token renamed


def _forced(propose, prompt=PROMPT, reply=REPLY) -> tuple[int, int]:
    """Drafting on a known reply: each step verifies what `propose(view)` gives (cut at the reply's
    end) and commits the matched tokens plus one. Returns (steps, draft rows)."""
    out: list[int] = []
    view = TokenView(prompt, out)
    steps = rows = 0
    while len(out) < len(reply):
        draft = propose(view)[:len(reply) - len(out) - 1]
        m = 0
        while m < len(draft) and draft[m] == reply[len(out) + m]:
            m += 1
        out.extend(reply[len(out):len(out) + m + 1])
        steps, rows = steps + 1, rows + len(draft)
    return steps, rows


def _replayed(src: TraceDrafts, backend: FakeBackend):
    """The replay's proposals in the reply's tokens: its right tokens are the reply's, the rest wrong."""
    def propose(view):
        draft = src.propose(0, view, K_MAX)
        truth = backend.next_tokens(0, len(draft))
        m = next((i for i, (a, b) in enumerate(zip(draft, truth)) if a != b), len(draft))
        j = len(view) - view.prompt_len
        return REPLY[j:j + m] + [-1] * (len(draft) - m)
    return propose


class _Counting(NgramSource):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def propose(self, key, tokens, k):
        self.calls += 1
        return super().propose(key, tokens, k)


def test_a_lookup_is_judged_at_every_position_without_asking_the_runs_source_more():
    inner, plain = _Counting(), NgramSource()
    rec = RecordingSource(inner, fresh=NgramSource)
    given, alone = [], []

    def cpu_like(view):  # the recorded run's policy verifies 2 rows a step
        given.append(rec.propose(0, view, K_MAX))
        alone.append(plain.propose(0, view, K_MAX))
        return given[-1][:2]

    _forced(cpu_like)
    calls = inner.calls
    rec.forget(0)
    (reply,) = rec.replies()
    assert given == alone  # recording changed nothing the run's lookup proposed
    assert inner.calls == calls  # judging every position asked a fresh lookup, not the run's
    assert reply.prompt_len == len(PROMPT) and len(reply.guesses) == len(REPLY)
    fresh = NgramSource()
    for j, g in enumerate(reply.guesses):
        draft = fresh.propose(0, PROMPT + REPLY[:j], K_MAX)
        assert g.asked == K_MAX and g.match_length == fresh.match_length(0)
        left = len(REPLY) - j  # a guess running past the reply's end keeps only its judged tokens
        assert g.proposed == (min(len(draft), left) if REPLY[j:j + len(draft)] == draft[:left] else len(draft))
        assert REPLY[j:j + g.matched] == draft[:g.matched]
        assert g.matched == g.proposed or REPLY[j + g.matched] != draft[g.matched]
    assert reply.guesses[12].matched == 0 and reply.guesses[4].matched == 8  # the rename, the copy


def test_the_replay_makes_the_steps_forced_lookup_made_on_the_reply_whatever_steps_the_run_took():
    rec = RecordingSource(NgramSource(), fresh=NgramSource)
    _forced(lambda view: rec.propose(0, view, K_MAX)[:2])  # a CPU run drafting 2 rows a step
    rec.forget(0)
    fresh = NgramSource()
    truth = _forced(lambda view: fresh.propose(0, view, K_MAX))
    backend = FakeBackend(n_seq_max=1)
    at_position = _forced(_replayed(TraceDrafts(backend, DraftKind.NGRAM, rec.guesses, replies=rec.replies()),
                                    backend))
    in_turn = _forced(_replayed(TraceDrafts(backend, DraftKind.NGRAM, rec.guesses), backend))
    assert at_position == truth
    # The run's own guesses replayed in turn come from its 2-row steps: overlapping windows along
    # the copy, so a drafter of full windows replaying them makes other steps than the reply allows.
    assert in_turn != truth


def test_the_replay_takes_a_reply_after_a_prompt_of_the_same_length_then_the_others():
    def reply(prompt_len, matched):
        return Reply(prompt_len, tuple(Guess(K_MAX, K_MAX, m, 8 * m) for m in matched))

    backend = FakeBackend(n_seq_max=2)
    src = TraceDrafts(backend, DraftKind.NGRAM, [], replies=[reply(5, [1, 2, 3]), reply(7, [4, 5])])

    def matched(key, prompt_len, written):
        draft = src.propose(key, TokenView([9] * prompt_len, [9] * written), K_MAX)
        truth = backend.next_tokens(key, len(draft))
        return next((i for i, (a, b) in enumerate(zip(draft, truth)) if a != b), len(draft)), src.match_length(key)

    assert matched(0, 7, 1) == (5, 40)
    assert matched(0, 7, 2) == (1, 8)  # past its reply: the next one, from its start
    assert matched(1, 5, 2) == (3, 24)
    assert src.propose(1, TokenView([9] * 5, [9]), 2) and matched(1, 5, 1) == (2, 16)
    src.forget(1)
    assert matched(1, 7, 0) == (4, 32)  # a new request on the key: its own prompt's reply


def test_a_paid_source_is_never_judged_at_every_position():
    from backend.fake import Acceptance, ScriptedDrafts

    with pytest.raises(ValueError, match="free source"):
        RecordingSource(ScriptedDrafts(FakeBackend(n_seq_max=1), Acceptance.ALL, ms=1.0), fresh=NgramSource)


def test_a_replayed_draft_model_takes_its_draft_steps_on_the_simulated_clock():
    from backend.simulated import SimulatedBackend
    from scheduler.drafts import DraftWant, propose_all

    backend = SimulatedBackend("rx9070xt", n_seq_max=3)
    model = TraceDrafts(backend, DraftKind.DRAFT_MODEL, [Guess(K_MAX, K_MAX, K_MAX)], step_ms=1.5)
    lookup = TraceDrafts(backend, DraftKind.NGRAM, [Guess(K_MAX, K_MAX, K_MAX)])
    wants = [DraftWant(key, [1, 2, 3], k) for key, k in ((0, 4), (1, 2), (2, 4))]
    t0 = backend.clock()
    out = propose_all(model, wants)
    assert [len(out[key]) for key in range(3)] == [4, 2, 4]
    assert backend.clock() - t0 == pytest.approx(0.006)  # 4 draft steps, all three sequences in each
    propose_all(lookup, wants)
    assert backend.clock() - t0 == pytest.approx(0.006)  # a lookup costs no simulated time
