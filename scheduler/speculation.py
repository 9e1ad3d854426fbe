"""Provides the speculation policy: which sequences draft in a step, from which source, how many rows.

Draft rows are rows: they compete with everything else for the step. Verifying k drafts of one
sequence costs k more rows with logits; what they buy is the drafts the target model accepts. So
per step, with each sequence's acceptance estimate p (the chance that a draft token is accepted
given the one before it was), the j-th draft row of a sequence is worth p^j expected tokens, and
rows are added best first while they raise the step's committed tokens per ms by a margin (SmartSpec's goodput
rule). When a row costs as much as a decode row and the step already holds many decode rows (8-16
sequences on a CPU), no draft row pays and k is 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable
from typing import Sequence as Seq

from scheduler.drafts import DraftKind, DraftSource

__all__ = ["AcceptanceEstimate", "DraftOffer", "SpecMode", "draft_lengths", "parse_spec_mode", "row_can_pay"]

# The most draft rows one sequence verifies in a step; beyond ~8 even a 0.9 acceptance rate adds
# under half a token per row.
K_MAX = 8

# A moving estimate: each verification's evidence is worth this much of the next one's, so about
# the last dozen verifications count (a reply moves between copying and writing anew).
DECAY = 0.92
# How many observations the prior (the source's estimate over all sequences) is worth in a new
# sequence's estimate, so one lucky or unlucky first verification does not decide its drafting.
PRIOR_WEIGHT = 4.0
# Where a source's estimate starts before any sequence used it. n-gram lookup must earn its rows:
# at 0.5 it does not pay on a CPU, and its free shadow guesses (below) raise it where it would.
PRIORS = {DraftKind.NGRAM: 0.5, DraftKind.DRAFT_MODEL: 0.7}
# A guess backed by at least this many tokens of verbatim agreement (the sequence's latest tokens
# equal a run of earlier ones, `match_length`) is a copy under way, not a chance 2-gram: it has its
# own estimates, starting at LONG_PRIOR (first row) and LONG_PRIOR_MORE (a row after an accepted one)
# instead of the source's prior: a long match drafts from its first step instead of waiting for the
# estimates to learn what its evidence already says (the counts: docs/design/speculation.md, "The
# evidence behind a guess").
LONG_MATCH = 8
LONG_PRIOR = 0.8
LONG_PRIOR_MORE = 0.95
# A draft row must beat the step's tokens per ms by this much, not merely match it: the acceptance
# estimate and the row's cost are both estimates, and a loaded CPU's steps are noisy (measured:
# docs/design/speculation.md, "The goodput rule").
GAIN_MARGIN = 0.15


class SpecMode(str, Enum):
    """`--spec`: which drafts a step verifies."""

    OFF = "off"  # never speculate
    NGRAM = "ngram"  # always verify n-gram lookup's guesses (K_MAX rows when it has them)
    DRAFT = "draft"  # always verify the draft model's guesses (K_MAX rows)
    AUTO = "auto"  # any source, k per sequence and step from the cost model and acceptance

    @property
    def forced(self) -> DraftKind | None:
        """The one source a forced mode drafts with at full length (None: off or adaptive)."""
        return {SpecMode.NGRAM: DraftKind.NGRAM, SpecMode.DRAFT: DraftKind.DRAFT_MODEL}.get(self)

    @property
    def help(self) -> str:
        """What the mode does, in the words the command palette shows."""
        return {
            SpecMode.AUTO: "Draft tokens where the cost model says verifying them pays (the default)",
            SpecMode.NGRAM: "Always verify n-gram lookup guesses from each conversation's own text",
            SpecMode.DRAFT: "Always verify the draft model's guesses (needs --draft-model)",
            SpecMode.OFF: "Never speculate: one token per sequence per step",
        }[self]


def parse_spec_mode(text: object) -> SpecMode:
    """`off`, `ngram`, `draft` or `auto`; ValueError says what is accepted."""
    if isinstance(text, SpecMode):
        return text
    try:
        return SpecMode(str(text).strip().lower())
    except ValueError:
        raise ValueError(f"unknown speculation mode {text!r}: use off, ngram, draft or auto") from None


@dataclass
class AcceptanceEstimate:
    """Decayed counts of accepted draft tokens (hits) and first rejections (misses).

    Under the usual model (each draft token accepted with probability p once the one before it
    was), a verification of k tokens that accepts a of them shows a hits and, if a < k, one miss;
    hits / (hits + misses) is then the maximum-likelihood p."""

    hits: float = 0.0
    misses: float = 0.0

    def observe(self, accepted: int, rejected: bool) -> None:
        self.hits = self.hits * DECAY + accepted
        self.misses = self.misses * DECAY + (1.0 if rejected else 0.0)

    def p(self, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        return (self.hits + weight * prior) / (self.hits + self.misses + weight)


@dataclass
class Shadow:
    """A free source's guess judged for free against the tokens that come after it: the guess
    `tokens` for positions `pos`, `pos` + 1, ...; depths below `depth` are judged already (or
    were verified as draft rows). `long`: backed by a long match (it teaches those estimates)."""

    kind: DraftKind
    pos: int
    tokens: tuple[int, ...]
    depth: int = 0
    long: bool = False


@dataclass
class SpecState:
    """One sequence's speculation: per-source estimates and what it drafted and accepted.

    Two estimates per source: the first draft row, and a draft row after an accepted one. A reply
    that copies is wrong about where a copy starts far more often than about how it goes on (the
    lookup's first guess after a paraphrase is a miss, the next six after a match are hits), so one
    geometric p undervalues long drafts exactly where they pay."""

    estimates: dict[tuple[DraftKind, bool, bool], AcceptanceEstimate] = field(default_factory=dict)
    # Guesses waiting for their tokens: one a step for the first-row estimate (its first token
    # only), and one at a time judged at every depth (a guess a step judged whole would count
    # each token up to K_MAX times and the deeper estimate would forget within a step or two).
    shadows: list[Shadow] = field(default_factory=list)
    # Per source: whether the latest draft token judged (verified, or a free guess judged) was a
    # hit. A copy does not stop at a step's edge: after a hit the lookup's next guess goes on with
    # the same match, so its first row is a row after an accepted one, not a fresh start.
    copying: dict[DraftKind, bool] = field(default_factory=dict)
    # Per source: whether the guess verified this step was backed by a long match.
    drafted_long: dict[DraftKind, bool] = field(default_factory=dict)
    # Per source: (match length, the sequence's tokens) of its latest guess backed by a match. A
    # guess continues that copy only if its match grew by every token committed since.
    matched: dict[DraftKind, tuple[int, int]] = field(default_factory=dict)

    def estimate(self, kind: DraftKind, deeper: bool = False, long: bool = False) -> AcceptanceEstimate:
        """`long`: the estimate for guesses backed by at least LONG_MATCH tokens of agreement."""
        return self.estimates.setdefault((kind, deeper, long), AcceptanceEstimate())


def observe_run(first: AcceptanceEstimate, deeper: AcceptanceEstimate, depth: int, matched: int,
                decided: bool) -> None:
    """Draft tokens judged from `depth` on: `matched` hits in a row, then a miss if `decided`.
    Depth 0 teaches the first-row estimate, depths 1+ the deeper one."""
    end = depth + matched  # the depth of the miss, when decided
    if depth == 0 and (matched or decided):
        first.observe(int(matched > 0), matched == 0)
    start = max(1, depth)
    hits, miss = max(0, end - start), decided and end >= start
    if hits or miss:
        deeper.observe(hits, miss)


@dataclass(frozen=True)
class DraftOffer:
    """One sequence's case for drafting this step, in the policy's numbers."""

    p: float  # acceptance estimate of the first draft row
    cap: int  # most draft rows it may verify (proposal length, max_tokens, context, K_MAX)
    row_ms: float  # what one more of its rows adds to the step
    source: int = 0  # which entry of `draft_ms` prices its source's drafting
    p_more: float | None = None  # of a row after an accepted one (None: p, one geometric rate)

    def reach(self, j: int) -> float:
        """Expected tokens the j-th draft row (1-based) adds: the chance rows 1..j are all accepted."""
        return self.p * (self.p if self.p_more is None else self.p_more) ** (j - 1)


def draft_lengths(offers: Seq[DraftOffer], *, base_ms: float, base_tokens: float, room_rows: int,
                  room_ms: float | None = None,
                  draft_ms: Seq[Callable[[int, int], float]] = ()) -> list[int]:
    """Draft rows per offer that maximise expected committed tokens per ms of the step.

    `base_ms` is the step without drafts and `base_tokens` what it commits (one per generating
    sequence). A row is added (best expected tokens per ms first) while it raises the ratio by GAIN_MARGIN, the
    step has rows left (`room_rows`), and the extra time stays within `room_ms` (None: no cap).
    `draft_ms[i](k, n)` is what source i costs to propose k tokens for each of n sequences.
    """
    ks = [0] * len(offers)
    tokens, ms, extra_ms = float(base_tokens), float(base_ms), 0.0

    def source_ms(src: int, ks_now: list[int]) -> float:
        if src >= len(draft_ms):
            return 0.0
        mine = [k for o, k in zip(offers, ks_now) if o.source == src and k > 0]
        return draft_ms[src](max(mine), len(mine)) if mine else 0.0

    for _ in range(room_rows):
        best, best_rate, best_cost = -1, 0.0, 0.0
        for i, o in enumerate(offers):
            if ks[i] >= o.cap or o.p <= 0.0:
                continue
            trial = ks[:]
            trial[i] += 1
            cost = o.row_ms + source_ms(o.source, trial) - source_ms(o.source, ks)
            gain = o.reach(ks[i] + 1)
            rate = gain / cost if cost > 0 else float("inf")
            if rate > best_rate:
                best, best_rate, best_cost = i, rate, cost
        # The best row left must buy tokens at least GAIN_MARGIN faster than the step without
        # drafts, and raise the step's tokens per ms at all.
        if best < 0 or ms <= 0 or best_rate * base_ms <= base_tokens * (1.0 + GAIN_MARGIN) \
                or best_rate * ms <= tokens:
            break
        if room_ms is not None and extra_ms + best_cost > room_ms:
            break
        ks[best] += 1
        tokens += offers[best].reach(ks[best])
        ms += best_cost
        extra_ms += best_cost
    return ks


def row_can_pay(row_ms: float, base_ms: float, base_tokens: float) -> bool:
    """Whether a sequence's first draft row could pass `draft_lengths`' bar at all: even accepted
    for sure (p = 1) it must raise the step's tokens per ms by GAIN_MARGIN. Rows after the first
    are worth less and the bar only rises, so a sequence failing this drafts nothing this step."""
    if row_ms <= 0:
        return True
    return base_ms > 0 and base_ms / row_ms > base_tokens * (1.0 + GAIN_MARGIN)


def pick_source(offers: Seq[tuple[float, float]], row_ms: float) -> int:
    """Which source a sequence drafts from: the one whose first draft row buys the most expected
    tokens per ms. `offers[i]` is (acceptance estimate, that source's drafting cost per sequence
    for one token). Acceptance alone would pick a draft model that predicts well but costs a whole
    step to run, which the draft lengths then price out, leaving a free lookup that pays unused."""
    return max(range(len(offers)), key=lambda i: offers[i][0] / max(row_ms + offers[i][1], 1e-9))


def available_sources(mode: SpecMode, sources: dict[DraftKind, DraftSource]) -> list[DraftSource]:
    """The sources a mode drafts with; ValueError when a forced mode's source is missing."""
    if mode is SpecMode.OFF:
        return []
    forced = mode.forced
    if forced is None:
        return list(sources.values())
    if forced not in sources:
        drafted = forced is DraftKind.DRAFT_MODEL
        needs, hint = ("a draft model", " (start with --draft-model PATH)") if drafted else ("n-gram lookup", "")
        raise ValueError(f"--spec {mode.value} needs {needs}, and none is loaded{hint}; use --spec auto or off")
    return [sources[forced]]
