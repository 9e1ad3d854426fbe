"""Provides Speculator: the drafts of one step, per generating sequence, and what they taught.

The planner asks it (`step_drafts`), after decode rows and prompt rows are placed, which sequences
verify which draft tokens in the rows left; the engine tells it, through the planner, how many were accepted.
"""

from __future__ import annotations

from scheduler.budget import StepShape
from scheduler.cost_model import CostModel
from scheduler.drafts import DraftKind, DraftSource, DraftWant, match_length, propose_all
from scheduler.row_price import RowPrice
from scheduler.sequence import Sequence
from scheduler.speculation import (
    K_MAX,
    LONG_MATCH,
    LONG_PRIOR,
    LONG_PRIOR_MORE,
    PRIORS,
    AcceptanceEstimate,
    DraftOffer,
    Shadow,
    SpecMode,
    available_sources,
    draft_lengths,
    observe_run,
    pick_source,
    row_can_pay,
)
from scheduler.types import KV_PAD, AttentionPath

__all__ = ["Speculator"]


class Speculator:
    """Chooses drafts for a step under a `SpecMode` from the given sources, and keeps the moving
    acceptance estimates (per source over all sequences, per sequence on its own)."""

    def __init__(self, sources: dict[DraftKind, DraftSource] | None = None,
                 mode: SpecMode = SpecMode.OFF) -> None:
        self.sources: dict[DraftKind, DraftSource] = dict(sources or {})
        self.overall = {(kind, deeper, long): AcceptanceEstimate()
                        for kind in DraftKind for deeper in (False, True) for long in (False, True)}
        self.mode = SpecMode.OFF
        self.set_mode(mode)
        self.paused_steps = 0  # no drafts for this many steps (after "no KV slot" with drafts)
        self.num_drafted = 0
        self.num_accepted = 0
        self.row_price = RowPrice()  # a draft row's cost, measured from the engine's timed steps

    def learned(self) -> tuple[dict, RowPrice]:
        """What this speculator learned across sequences: the overall acceptance estimates and the
        measured row price (a sequence's own estimates end with it)."""
        return self.overall, self.row_price

    def adopt(self, learned: tuple[dict, RowPrice] | None) -> None:
        """Go on from `learned` (from `learned()`), or from the priors when None: a benchmark that
        compares modes on one engine gives each mode only what its own runs taught (forced lookup's
        wasted rows would otherwise lower the estimates `auto` starts from)."""
        if learned is None:
            self.overall = {key: AcceptanceEstimate() for key in self.overall}
            self.row_price = RowPrice()
        else:
            self.overall, self.row_price = learned

    def set_mode(self, mode: SpecMode) -> None:
        """ValueError when the mode needs a source that is not loaded (`draft` without a model)."""
        available_sources(mode, self.sources)
        self.mode = mode

    def pause(self, steps: int) -> None:
        self.paused_steps = max(self.paused_steps, steps)

    def p(self, seq: Sequence, kind: DraftKind, deeper: bool = False, long: bool = False) -> float:
        """The sequence's acceptance estimate for a source's first draft row (or, `deeper`, a row
        after an accepted one), drawn toward the source's overall one; a row after an accepted one
        starts where the first row is. `long`: of a guess backed by a long match, whose estimates
        start at LONG_PRIOR and LONG_PRIOR_MORE and learn from such guesses only."""
        first = self.overall[(kind, False, long)].p(LONG_PRIOR if long else PRIORS[kind])
        if not deeper:
            return seq.spec.estimate(kind, False, long).p(first)
        prior = self.overall[(kind, True, long)].p(LONG_PRIOR_MORE if long else first)
        return seq.spec.estimate(kind, deeper, long).p(prior)

    def _observe(self, seq: Sequence, kind: DraftKind, depth: int, matched: int, decided: bool,
                 long: bool = False) -> None:
        # While a copy goes on, a guess's first token continues it: it was priced as a row after
        # an accepted one and teaches that estimate, so the first-row one stays the chance that a
        # fresh guess (after a miss) is right.
        if depth == 0 and seq.spec.copying.get(kind, False):
            depth = 1  # the same hits and miss, one depth on: all of them teach the deeper estimate
        observe_run(seq.spec.estimate(kind, False, long), seq.spec.estimate(kind, True, long), depth, matched,
                    decided)
        observe_run(self.overall[(kind, False, long)], self.overall[(kind, True, long)], depth, matched, decided)
        if decided or matched:
            seq.spec.copying[kind] = not decided

    # ---- planning ------------------------------------------------------------------------------

    def step_drafts(self, decoding: list[Sequence], shape: StepShape | None, grants: list[tuple[Sequence, int]],
                    *, cost: CostModel, target_ms: float | None,
                    n_ctx_seq: int) -> dict[int, tuple[DraftKind, tuple[int, ...]]]:
        """Draft tokens per seq id for the rows a step has left once every decode row (`decoding`)
        and the prompts' `grants` are placed: drafts never take a decode row's or a newcomer's
        place. While prompt rows still wait beyond this step, drafts may only use the time a target
        policy (`target_ms`) leaves. `shape` is the step's, built once by the planner (None: a
        prefill-first step that runs prompts only)."""
        if not decoding or shape is None or self.mode is SpecMode.OFF:
            return {}
        granted = sum(n for _, n in grants)
        room_rows = max(0, min(shape.n_batch, max(shape.n_ubatch, len(decoding))) - len(decoding) - granted)
        room_ms = None
        if shape.pending_rows > granted:
            base = cost.predict(len(decoding), granted, shape.kpos(granted))
            room_ms = max(0.0, (target_ms or 0.0) - base)
        return self.plan(decoding, cost=cost, shape=shape, prefill_rows=granted, room_rows=room_rows,
                         room_ms=room_ms, n_ctx_seq=n_ctx_seq)

    def plan(self, decoding: list[Sequence], *, cost: CostModel, shape: StepShape, prefill_rows: int,
             room_rows: int, room_ms: float | None, n_ctx_seq: int) -> dict[int, tuple[DraftKind, tuple[int, ...]]]:
        """Draft tokens per seq id for the sequences that speculate in this step."""
        for seq in decoding:
            self._judge_shadow(seq)
        if self.paused_steps > 0:
            self.paused_steps -= 1
            return {}
        sources = available_sources(self.mode, self.sources)
        if not sources or room_rows <= 0 or not decoding:
            return {}
        kinds = [s.kind for s in sources]
        caps = {seq.slot: self._cap(seq, n_ctx_seq) for seq in decoding}
        base_ms = cost.predict(shape.decode_rows, prefill_rows, shape.kpos(prefill_rows))
        row_ms: dict[int, float] = {}
        if self.mode.forced is None:
            # One more row of each sequence, priced once a step (the measured price is the same
            # for every sequence of this width). A sequence whose first draft row would not pay
            # even if every guess were accepted drafts nothing this step whatever its source
            # guesses, so nothing is looked up for it (and no new shadow made): at 8-16 sequences
            # on a CPU that is every sequence, every step.
            measured = self._measured_row_ms(cost, shape)
            for seq in decoding:
                row_ms[seq.slot] = measured if measured is not None else self._model_row_ms(seq, cost, shape)
                if not row_can_pay(row_ms[seq.slot], base_ms, shape.decode_rows):
                    caps[seq.slot] = 0
        # Free sources guess now, for every sequence that could draft: the guess decides their
        # offer, and what is not verified is judged later for free against the tokens that come.
        guesses: dict[int, list[int]] = {}
        guessed_by: dict[int, DraftKind] = {}
        long: dict[int, bool] = {}  # whether a long match backs the free guess (see LONG_MATCH)
        for seq in decoding:
            for src in sources:
                if caps[seq.slot] > 0 and src.draft_ms(1, 1) == 0.0:
                    guesses[seq.slot] = src.propose(seq.slot, seq.tokens_view(), K_MAX)[:caps[seq.slot]]
                    guessed_by[seq.slot] = src.kind
                    evidence = match_length(src, seq.slot)
                    long[seq.slot] = evidence >= LONG_MATCH
                    self._left_the_copy(seq, src.kind, evidence)
                    break
        if self.mode.forced is not None:
            ks = self._forced(decoding, sources[0], guesses, caps, room_rows)
            chosen = {seq.slot: sources[0].kind for seq in decoding}
        elif self.row_price.wants_plain(shape.decode_rows):
            ks, chosen = {}, {}  # measure the width's plain step first; the guesses become shadows
        else:
            ks, chosen = self._adaptive(decoding, sources, kinds, guesses, long, caps, row_ms, shape=shape,
                                        base_ms=base_ms, room_rows=room_rows, room_ms=room_ms)
        # A paid source (a draft model) drafts for all its sequences in one call: one batch per
        # draft position, not one per sequence.
        wants: dict[DraftKind, list[DraftWant]] = {}
        for seq in decoding:
            k, kind = ks.get(seq.slot, 0), chosen.get(seq.slot)
            if k > 0 and kind is not None and not (self.sources[kind].draft_ms(1, 1) == 0.0
                                                   and guesses.get(seq.slot)):
                wants.setdefault(kind, []).append(DraftWant(seq.slot, seq.tokens_view(), k))
        drafted = {kind: propose_all(self.sources[kind], ws) for kind, ws in wants.items()}
        out: dict[int, tuple[DraftKind, tuple[int, ...]]] = {}
        for seq in decoding:
            k, kind = ks.get(seq.slot, 0), chosen.get(seq.slot)
            guess = guesses.get(seq.slot, [])
            tokens: list[int] = []
            if k > 0 and kind is not None:
                src = self.sources[kind]
                tokens = guess[:k] if src.draft_ms(1, 1) == 0.0 and guess else drafted[kind].get(
                    seq.slot, [])[:k]
                if tokens:
                    out[seq.slot] = (kind, tuple(tokens))
                    seq.spec.drafted_long[kind] = long.get(seq.slot, False) and kind == guessed_by.get(seq.slot)
            # The free guess beyond what is verified now is judged against the tokens that come:
            # all of it when nothing is drafted, its tail when a verification accepts every row.
            depth = len(tokens) if tokens and out[seq.slot][0] == guessed_by.get(seq.slot) else 0
            if guess and (not tokens or depth) and depth < len(guess):
                deep = not any(len(sh.tokens) > 1 for sh in seq.spec.shadows)
                if deep or not depth:
                    seq.spec.shadows.append(Shadow(guessed_by[seq.slot], seq.num_tokens,
                                                   tuple(guess if deep else guess[:1]), depth,
                                                   long.get(seq.slot, False)))
        return out

    @staticmethod
    def _left_the_copy(seq: Sequence, kind: DraftKind, evidence: int) -> None:
        """A copy goes on (`SpecState.copying`) only while the source still copies the same place:
        then the match behind its guess grew by every token committed since its guess before. A
        shorter one is a new place found (a fresh 2-gram after the reply left the copy), whose
        first token is as uncertain as any fresh guess's, whatever the last judged token was."""
        before = seq.spec.matched.get(kind)
        if evidence <= 0:
            return  # a source that cannot say (or no match): the judged tokens decide alone
        seq.spec.matched[kind] = (evidence, seq.num_tokens)
        if before is not None and evidence < before[0] + seq.num_tokens - before[1]:
            seq.spec.copying[kind] = False

    def _cap(self, seq: Sequence, n_ctx_seq: int) -> int:
        """Draft rows the sequence could use: each step commits at most k + 1 tokens, and the
        verified rows must stay inside its context. A constrained reply does not draft: its rows
        are sampled under a grammar the draft sources know nothing of."""
        if seq.constrained:
            return 0
        left = seq.max_tokens - len(seq.output) - 1
        return max(0, min(K_MAX, left, n_ctx_seq - seq.num_computed - 1))

    def _forced(self, decoding, source: DraftSource, guesses, caps, room_rows) -> dict[int, int]:
        ks: dict[int, int] = {}
        for seq in decoding:
            want = len(guesses.get(seq.slot, [])) if source.draft_ms(1, 1) == 0.0 else caps[seq.slot]
            ks[seq.slot] = k = min(want, room_rows)
            room_rows -= k
        return ks

    def timed(self, decode_rows: int, draft_rows: int, prefill_rows: int, step_ms: float,
              kpos: float = 0.0, predict=None) -> None:
        """A successful step's rows and measured time (what prices draft rows once there is enough);
        `kpos` and `predict`: see RowPrice.observe."""
        self.row_price.observe(decode_rows, draft_rows, prefill_rows, step_ms, kpos, predict)

    def _measured_row_ms(self, cost: CostModel, shape: StepShape) -> float | None:
        """One more draft row, from what draft rows measurably added to decode-only steps of this
        width (a share of the step without them); None until there is enough evidence."""
        share = self.row_price.share(shape.decode_rows)
        return None if share is None else share * cost.predict(shape.decode_rows, 0, shape.kpos(0))

    @staticmethod
    def _model_row_ms(seq: Sequence, cost: CostModel, shape: StepShape) -> float:
        """The cost model's price of one more row of this sequence: a row with logits, attending
        over its positions (or, without flash attention, over every used cell)."""
        params = cost.params
        if shape.path is AttentionPath.DENSE:
            n_kv = -(-(shape.cells_used + 1) // KV_PAD) * KV_PAD
            return params.decode_ms + params.attn_ms * n_kv / 1000.0
        return params.decode_ms + params.attn_ms * (seq.num_computed + 2) / 1000.0

    def _adaptive(self, decoding, sources, kinds, guesses, long, caps, row_ms: dict[int, float], *,
                  shape: StepShape, base_ms: float, room_rows: int, room_ms: float | None):
        offers, owners, chosen = [], [], {}
        n = len(decoding)
        # What each source costs per sequence to propose one token, were every sequence drafting.
        share = {src.kind: src.draft_ms(1, n) / n for src in sources}
        for seq in decoding:
            candidates: list[tuple[DraftKind, int, bool, float]] = []
            for src in sources:
                free = src.draft_ms(1, 1) == 0.0
                cap = len(guesses.get(seq.slot, [])) if free else caps[seq.slot]
                if cap > 0:
                    copying = seq.spec.copying.get(src.kind, False)
                    backed = free and long.get(seq.slot, False)
                    candidates.append((src.kind, cap, backed, self.p(seq, src.kind, copying, backed)))
            if not candidates:
                continue
            kind, cap, backed, p = candidates[pick_source([(p, share[k]) for k, _, _, p in candidates],
                                                          row_ms[seq.slot])]
            chosen[seq.slot] = kind
            offers.append(DraftOffer(p=p, cap=cap, row_ms=row_ms[seq.slot], source=kinds.index(kind),
                                     p_more=self.p(seq, kind, True, backed)))
            owners.append(seq.slot)
        if not offers:
            return {}, chosen
        ks = draft_lengths(offers, base_ms=base_ms, base_tokens=shape.decode_rows, room_rows=room_rows,
                           room_ms=room_ms, draft_ms=[s.draft_ms for s in sources])
        return dict(zip(owners, ks)), chosen

    def _judge_shadow(self, seq: Sequence) -> None:
        """Free guesses against the tokens committed since they were made, each from its first
        depth not judged yet; a guess waits while none of its remaining depths has a token."""
        seq.spec.shadows = [sh for sh in seq.spec.shadows if not self._judge(seq, sh)]

    def _judge(self, seq: Sequence, shadow: Shadow) -> bool:
        """Count what came for one guess; True once it is decided (a miss, or every depth judged)."""
        n = min(len(shadow.tokens), seq.num_tokens - shadow.pos)
        if n <= shadow.depth:
            return False  # no new token at its depths yet (the step failed, or it was just made)
        came = seq.token_range(shadow.pos + shadow.depth, shadow.pos + n)
        matched = next((i for i, t in enumerate(came) if t != shadow.tokens[shadow.depth + i]), None)
        decided = matched is not None
        self._observe(seq, shadow.kind, shadow.depth, len(came) if matched is None else matched, decided, shadow.long)
        shadow.depth = n
        return decided or n == len(shadow.tokens)

    # ---- after sampling ------------------------------------------------------------------------

    def verified(self, seq: Sequence, kind: DraftKind, drafted: int, judged: int, accepted: int) -> None:
        """Sampling accepted `accepted` of the `drafted` draft tokens it verified; `judged` of
        them were compared with a sampled token (the reply may end before the rest are)."""
        rejected = accepted < judged
        self._observe(seq, kind, 0, accepted, rejected, seq.spec.drafted_long.get(kind, False))
        if rejected:  # a guess's tail after the verified rows followed the rejected draft
            seq.spec.shadows = [sh for sh in seq.spec.shadows if not sh.depth]
        seq.num_drafted += drafted
        seq.num_accepted += accepted
        self.num_drafted += drafted
        self.num_accepted += accepted

    def forget(self, seq_id: int | None) -> None:
        """The slot's tokens are no longer the ones its sources indexed (ended, preempted)."""
        if seq_id is None:
            return
        for src in self.sources.values():
            src.forget(seq_id)
