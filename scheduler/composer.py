"""Provides BatchComposer: which rows of the running sequences go into the next batch.

Decode rows first (one per generating sequence, less those an agent holds back for a person's
prompt), then prompt rows up to what the policy allows beside them, shared between the prompts in
progress, then the draft rows that pay. The requests' life cycle, admission and residency are the
Scheduler's (`scheduler.planner`): composing a step moves no sequence's progress and no KV (only
`postprocess` commits a step's rows); it sets what each sequence's decode row verifies (its draft)
and whether it yields this step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from scheduler.budget import MIN_PREFILL_QUANTUM, Policy, StepShape, share_rows
from scheduler.cost_model import CostModel
from scheduler.ledger import KvLedger
from scheduler.ramp import PromptRamp
from scheduler.relief import KvRelief
from scheduler.sequence import Sequence
from scheduler.speculator import Speculator
from scheduler.types import AttentionPath, BatchPlan, Priority, SeqSlice, attended_kpos
from scheduler.yielding import AGENT_HOLD_MS, held_for_person

__all__ = ["BatchComposer"]


class BatchComposer:
    """Assembles each step's BatchPlan under the policy's budget: decode-first, chunked prefill.

    Shares the scheduler's cost model (what a step of given rows costs), prompt ramp, KV relief
    and speculator; owns the policy and what is only about composing a batch (the round-robin
    start among prompts, how long agents yield to a person, the plan counter).
    """

    def __init__(self, kv: KvLedger, *, policy: Policy, cost: CostModel, ramp: PromptRamp, relief: KvRelief,
                 speculator: Speculator, n_batch: int, n_ubatch: int, n_ctx_seq: int,
                 attention: AttentionPath, attention_tile: int, dense_kq_cells: int = 0) -> None:
        self.kv = kv
        self.policy = policy
        self.cost = cost
        self.ramp = ramp
        self.relief = relief
        self.speculator = speculator
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.n_ctx_seq = n_ctx_seq
        self.attention = attention
        self.attention_tile = attention_tile  # steps under this many rows attend one row at a time
        self.dense_kq_cells = dense_kq_cells  # dense: prompt rows x cells whose scores fit the cache
        # Under a target policy, agents' decode rows yield to a person's prompt for at most this
        # long each (yielding.py); 0: never.
        self.agent_hold_ms = AGENT_HOLD_MS
        self.num_yielded = 0  # decode rows held out of the last plan
        self._rr = 0  # round-robin start among prefilling sequences
        self._num_steps = 0

    def compose(self, running: list[Sequence], waiting: Iterable[Sequence], now: float) -> BatchPlan | None:
        """The next batch over the `running` sequences (None: no row to run); `waiting` tells
        whether a person's request is in line (then no step is paced for throughput)."""
        decoding: list[Sequence] = []
        prefilling: list[Sequence] = []
        for s in running:
            (decoding if s.is_decoding else prefilling).append(s)
        decoding.sort(key=lambda s: s.slot)
        prefilling.sort(key=lambda s: s.admit_order)
        held = (held_for_person(decoding, prefilling, now, self.agent_hold_ms)
                if self.policy.target_ms is not None else [])
        for s in running:
            s.yielding = s in held
        if held:
            decoding = [s for s in decoding if not s.yielding]
        self.num_yielded = len(held)
        shape = None  # priced once per step: the allowance and the drafts read the same shape
        if self.policy.is_prefill_first and prefilling:
            # The common default: prompts jump the queue and every generating sequence waits.
            decoding = []
            allowance = self.n_batch
            budget = self.n_batch
        else:
            shape = self._shape(decoding, prefilling, paced=any(
                s.priority is Priority.INTERACTIVE for s in (*running, *waiting)))
            allowance = self.policy.prefill_allowance(shape, self.cost)
            if self.policy.target_ms is not None:
                allowance = self.ramp.cap(allowance)
            budget = min(self.n_batch, len(decoding) + allowance)
        allowance = self.relief.cap(allowance)
        grants = self._share_prefill(prefilling, allowance)
        drafts = self.speculator.step_drafts(decoding, shape, grants, cost=self.cost,
                                             target_ms=self.policy.target_ms, n_ctx_seq=self.n_ctx_seq)
        budget = min(self.n_batch, budget + sum(len(t) for _, t in drafts.values()))
        slices = []
        for s in decoding:
            kind, draft = drafts.get(s.slot, (None, ()))
            s.draft, s.draft_kind = draft, kind
            slices.append(SeqSlice(s.slot, s.num_computed, s.token_range(s.num_computed, s.num_tokens) + draft,
                                   want_logits=True, is_decode=True, n_draft=len(draft)))
        for s, n in grants:
            end = s.num_computed + n
            slices.append(SeqSlice(s.slot, s.num_computed, s.token_range(s.num_computed, end),
                                   want_logits=end == s.num_tokens, is_decode=False))
        if not slices:
            return None
        for s in [*decoding, *(s for s, _ in grants)]:
            s.metrics.on_scheduled(now)
        self._num_steps += 1
        return BatchPlan(step=self._num_steps, slices=tuple(slices), budget=budget)

    def _shape(self, decoding: list[Sequence], prefilling: list[Sequence], paced: bool) -> StepShape:
        return StepShape(
            decode_rows=len(decoding),
            decode_kpos=sum(attended_kpos(s.num_computed, 1) for s in decoding),
            prefill_pos0=max((s.num_computed for s in prefilling), default=0),
            cells_used=self.kv.span_cells(), path=self.attention,
            n_batch=self.n_batch, n_ubatch=self.n_ubatch,
            pending_rows=sum(s.num_pending for s in prefilling), tile_rows=self.attention_tile,
            kq_cells=self.dense_kq_cells,
            sampling_ms=sum(s.mask_ms_per_token for s in decoding if s.grammar is not None),
            paced=paced)

    def _share_prefill(self, prefilling: list[Sequence], allowance: int) -> list[tuple[Sequence, int]]:
        """A higher priority class first, always. Within a class: first come first served under
        prefill-first; under target:MS the prompt closest to its first token first (the order that
        gets a burst of newcomers started soonest on average; a long prompt waits only for shorter
        ones that arrived before it finished); otherwise bounded quanta starting from a different
        sequence each step (round-robin)."""
        if not prefilling or allowance <= 0:
            return []
        if self.policy.is_prefill_first:
            first = sorted(prefilling, key=lambda s: s.priority)
            return share_rows(first, [s.num_pending for s in first], allowance, allowance)
        if self.policy.serves_shortest_first:
            order = sorted(prefilling, key=lambda s: (s.priority, s.num_pending, s.admit_order))
            return share_rows(order, [s.num_pending for s in order], allowance, allowance)
        start = self._rr % len(prefilling)
        self._rr += 1
        rotated = prefilling[start:] + prefilling[:start]
        grants: list[tuple[Sequence, int]] = []
        # A higher class's prompts take what they can use before a lower class gets any.
        for cls in sorted({s.priority for s in rotated}):
            order = [s for s in rotated if s.priority == cls]
            quantum = max(MIN_PREFILL_QUANTUM, math.ceil(allowance / len(order)))
            dealt = share_rows(order, [s.num_pending for s in order], allowance, quantum)
            grants += dealt
            allowance -= sum(n for _, n in dealt)
            if allowance <= 0:
                break
        return grants
