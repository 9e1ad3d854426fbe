"""Provides the Scheduler: the requests' life cycle, from admission to the commit of each step.

Admission (slots, KV room, reuse) is in `scheduler.admission`, the slots and resident KV of
conversations in `scheduler.residency`, the remedies for "no KV slot" in `scheduler.relief`, and
which rows go into the next batch in `scheduler.composer`.
"""

from __future__ import annotations

from collections import deque

from scheduler.admission import WAITING_FOR_PREVIOUS_TURN, Admission, RequestError
from scheduler.budget import Policy, parse_policy
from scheduler.composer import BatchComposer
from scheduler.cost_model import CostModel
from scheduler.drafts import DraftKind
from scheduler.ledger import KvCache
from scheduler.ram_tier import DEFAULT_BYTES as DEFAULT_RAM_BYTES
from scheduler.ramp import PromptRamp
from scheduler.relief import DRAFT_PAUSE_STEPS, KvRelief, Remedy
from scheduler.residency import Residency
from scheduler.sequence import Sequence
from scheduler.speculation import SpecMode
from scheduler.speculator import Speculator
from scheduler.types import (
    AttentionPath,
    BatchPlan,
    DecodeOutcome,
    DoneReason,
    ErrorKind,
    Phase,
    plan_kpos,
)

__all__ = ["RequestError", "Scheduler"]


class Scheduler:
    """Runs the requests' life cycle step by step: admission, the batch (composed by its
    `composer`), the staged commit of each step's rows, preemption and the end of each request.

    Depends only on numbers and the KvCache operations.
    """

    def __init__(
        self,
        kv: KvCache,
        *,
        n_ctx: int,
        n_seq_max: int,
        n_batch: int,
        n_ctx_seq: int | None = None,
        policy: str | Policy = "target:50",
        gen_reserve: int = 256,
        cost: CostModel | None = None,
        attention: AttentionPath = AttentionPath.FLASH,
        n_ubatch: int | None = None,
        attention_tile: int = 0,
        dense_kq_cells: int = 0,
        speculator: Speculator | None = None,
        ram_bytes: int = DEFAULT_RAM_BYTES,
    ) -> None:
        if n_seq_max > n_batch:
            raise ValueError(f"n_seq_max ({n_seq_max}) must not exceed n_batch ({n_batch}): every "
                             "generating sequence needs its decode row in each step")
        self.residency = Residency(kv, n_seq_max, ram_bytes)
        self.kv = self.residency.kv  # the KV ledger
        self.sessions = self.residency.sessions
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx_seq or n_ctx
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        # How the backend's attention reads the cache: it decides what a row costs at depth and
        # whether idle conversations' resident KV slows everyone else's rows.
        self.attention = attention
        self.gen_reserve = gen_reserve
        self.cost = cost or CostModel()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.admission = Admission(self.residency, self.waiting, self.running, n_ctx=n_ctx,
                                   n_ctx_seq=self.n_ctx_seq, n_seq_max=n_seq_max,
                                   gen_reserve=gen_reserve)
        self.relief = KvRelief(n_batch)
        # Caps a target policy's prompt rows until measured steps bear the cost model out (ramp.py).
        self.ramp = PromptRamp(n_batch)
        # Which sequences verify draft tokens in the rows a step has left (speculation.md).
        self.speculator = speculator or Speculator()
        self.composer = BatchComposer(
            self.kv, policy=parse_policy(policy) if isinstance(policy, str) else policy, cost=self.cost,
            ramp=self.ramp, relief=self.relief, speculator=self.speculator, n_batch=n_batch,
            n_ubatch=min(n_ubatch or 512, n_batch), n_ctx_seq=self.n_ctx_seq, attention=attention,
            attention_tile=attention_tile, dense_kq_cells=dense_kq_cells)
        self.num_evicted_for_speed = 0  # idle conversations dropped because they slowed every row

    # ---- public state --------------------------------------------------------------------------

    @property
    def policy(self) -> Policy:
        """The budget policy the batches are composed under."""
        return self.composer.policy

    def set_policy(self, policy: str | Policy) -> None:
        self.composer.policy = parse_policy(policy) if isinstance(policy, str) else policy

    def set_spec(self, mode: SpecMode) -> None:
        """Switch speculation from the next step; ValueError if the mode's source is missing."""
        self.speculator.set_mode(mode)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def kv_used(self) -> int:
        return self.kv.cells_used()

    def kv_idle(self) -> int:
        """Cells only idle conversations hold: what they cost every row without flash attention."""
        return self.residency.idle_cells()

    def free_slots(self) -> list[int]:
        return self.residency.free_slots()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- requests in and out -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a tokenized request; RequestError if it could never run. It stays `preparing`
        (its cached prefix is looked up at admission) until admission is first tried."""
        self.admission.check(seq)
        self.waiting.append(seq)

    def held_tokens(self) -> list[list[int]]:
        """The tokens of every conversation whose KV a prompt could reuse: resident in a slot, or
        saved in host memory."""
        resident = [s.committed_tokens() for s in self.sessions.values() if s.seq_id is not None]
        return resident + self.residency.ram.all_tokens()

    def cancel(self, request_id: str) -> Sequence | None:
        for seq in [*self.running, *self.waiting]:
            if seq.request_id == request_id:
                self.finish(seq, DoneReason.CANCELLED)
                return seq
        return None

    def close_session(self, session_id: str) -> list[Sequence]:
        """Cancel the conversation's live requests and drop its resident KV and slot."""
        cancelled = [s for s in [*self.running, *self.waiting] if s.session_id == session_id]
        for seq in cancelled:
            self.finish(seq, DoneReason.CANCELLED)
        self.residency.close(session_id)
        return cancelled

    def restore_session(self, session_id: str, tokens: list[int], state: bytes) -> str | None:
        """Make a saved conversation resident and idle again (its next turn reuses `tokens`, the
        first positions of `state`), if that takes no one's room: a free slot and cells neither
        used nor promised to running sequences. Returns why not (None: restored). A backend that
        refuses the state raises, with nothing held."""
        if session_id in self.sessions:
            return "the conversation is already resident"
        free = self.free_slots()
        if not free:
            return f"no free sequence slot (all {self.n_seq_max} in use)"
        room = self.admission.kv_free()
        if len(tokens) > room:
            return f"needs {len(tokens):,} KV cells, {max(0, room):,} free"
        self.residency.adopt(session_id, free[0], tokens, state)
        return None

    def finish(self, seq: Sequence, reason: DoneReason, error: str | None = None,
               kind: ErrorKind | None = None) -> None:
        """End a request. A reply that ended normally, or was cancelled after some of its rows were
        committed, leaves its committed KV resident for the conversation's next turn; rows a step
        evaluated but never committed are trimmed. An error drops the KV; `kind` says what sort
        of error (the engine failing, unless told otherwise)."""
        if seq.is_finished:
            return
        seq.phase, seq.done_reason, seq.error, seq.waiting_reason = Phase.DONE, reason, error, None
        seq.error_kind = (kind or ErrorKind.FAILED) if reason is DoneReason.ERROR else None
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        keep = reason in (DoneReason.STOP, DoneReason.LENGTH) or (
            reason is DoneReason.CANCELLED and seq.num_computed > 0)
        # Committed KV only: draft rows a step verified but sampling did not accept are trimmed.
        self.residency.retire(seq, keep)
        self._release(seq)
        self.admission.hold = False

    def append_token(self, seq: Sequence, token: int) -> None:
        """Record a sampled token; it becomes a decode row in the next plan."""
        seq.output.append(token)
        seq.refresh_phase()

    def accept_draft(self, seq: Sequence) -> None:
        """The token just appended equals the next draft token: the draft row that evaluated it
        is now committed KV, and the next row's logits may be sampled."""
        if seq.num_computed >= self.kv.positions(seq.slot):
            raise RuntimeError(f"{seq!r}: no verified draft row left to accept")
        seq.num_computed += 1
        seq.refresh_phase()

    def settle_draft(self, seq: Sequence, kind: DraftKind, drafted: int, judged: int, accepted: int) -> None:
        """Sampling of a speculative step is over: of `drafted` draft tokens, `judged` were
        compared with a sampled token and `accepted` taken. Rows past the committed ones leave the KV cache and the ledger (a finished request
        was trimmed when it ended)."""
        self.speculator.verified(seq, kind, drafted, judged, accepted)
        seq.drop_draft()
        if not seq.is_finished and seq.seq_id is not None and self.kv.positions(seq.seq_id) > seq.num_computed:
            self._keep_computed(seq)

    def _keep_computed(self, seq: Sequence) -> None:
        """Drop the KV rows past the sequence's committed ones. Where the backend keeps fewer (a
        sliding-window model's window layers lost cells: Ledger.keep_prefix), what it lost is
        evaluated again, as after a preemption."""
        assert seq.seq_id is not None
        held = self.kv.keep_prefix(seq.seq_id, seq.num_computed)
        if held < seq.num_computed:
            seq.num_computed = held
            seq.refresh_phase()

    def preempt(self, seq: Sequence, why: str = "the KV cache was full") -> None:
        """Free a running sequence's KV and slot; it requeues first and later recomputes its
        prompt and every token generated so far (the text already shown stays shown)."""
        self.residency.unbind(seq)
        self.running.remove(seq)
        self._release(seq)
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.phase = Phase.QUEUED
        seq.waiting_reason = (f"preempted: {why}; will recompute its "
                              f"{seq.num_tokens:,} tokens when there is room")
        self.waiting.appendleft(seq)
        self.admission.hold = True

    def _release(self, seq: Sequence) -> None:
        """The sequence gives up its slot (it finished, or was preempted): what the speculator
        kept for the slot and any draft in flight go with it."""
        self.speculator.forget(seq.seq_id)
        seq.drop_draft()
        seq.seq_id = None

    # ---- one step ------------------------------------------------------------------------------

    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        """Admit what fits, then assemble the next batch: decode rows first, prompt rows after."""
        for seq, error in self.admission.admit(now):
            self.finish(seq, DoneReason.ERROR, str(error), error.kind)
        self._make_way(now)
        return self.composer.compose(self.running, self.waiting, now)

    def postprocess(self, plan: BatchPlan, result, error: str | None = None) -> list[Sequence]:
        """Commit a successful step (or undo a failed one); return the sequences to sample now.

        Progress moves only here, after the native decode succeeded, so a failed step leaves the
        scheduler's view equal to the KV cache.
        """
        outcome: DecodeOutcome = result.outcome
        at_slot = self._running_by_slot()
        planned = [(sl, at_slot.get(sl.seq_id)) for sl in plan.slices]
        if outcome is DecodeOutcome.OK:
            kpos = plan_kpos(plan, self.attention, self.kv.span_cells())
            # The plan's row counts are sums over its slices: taken once.
            n_decode, n_draft, n_prefill = plan.n_decode, plan.n_draft, plan.n_prefill
            ready = []
            for sl, seq in planned:
                # A sequence cancelled while the step ran is already gone: its slot keeps only
                # what its conversation committed, never this step's rows.
                if seq is None:
                    self.residency.trim_orphan(sl.seq_id)
                    continue
                if seq.num_computed != sl.pos0:
                    continue
                # Draft rows are in the KV cache (and the ledger mirrors it) but not committed:
                # sampling commits those it accepts, and the rest are trimmed (settle_draft).
                seq.num_computed += len(sl.tokens) - sl.n_draft
                self.kv.grow(sl.seq_id, len(sl.tokens))
                if sl.want_logits:
                    ready.append(seq)
                seq.refresh_phase()
            self.ramp.observe(n_prefill, result.step_ms,
                              self.cost.predict(n_decode + n_draft, n_prefill, kpos),
                              self.policy.target_ms)
            # A draft row carries logits like a decode row, and is priced as one.
            self.cost.observe(n_decode + n_draft, n_prefill, result.step_ms, kpos)
            # The decode rows' share of the attention (draft rows sit beside their sequence's):
            # draft rows are priced against plain steps brought to this step's depth.
            self.speculator.timed(n_decode, n_draft, n_prefill, result.step_ms,
                                  kpos * n_decode / max(1, n_decode + n_draft),
                                  lambda k: self.cost.predict(n_decode, 0, k))
            self.relief.on_success()
            self.num_evicted_for_speed += len(
                self.residency.charge_idle_rent(plan.n_rows, self.attention, self.cost))
            return ready
        for sl, seq in planned:
            if seq is not None:
                self._keep_computed(seq)
                seq.drop_draft()
            else:
                self.residency.trim_orphan(sl.seq_id)
        if outcome is DecodeOutcome.NO_KV_SLOT:
            self._relieve_kv(plan)
        elif outcome is not DecodeOutcome.ABORTED:
            why = error or f"the backend rejected the batch ({outcome.value}, code {result.code})"
            for _, seq in planned:
                if seq is not None:
                    self.finish(seq, DoneReason.ERROR, f"{why}; this request was stopped, others go on")
        return []

    # ---- making room ---------------------------------------------------------------------------

    def _make_way(self, now: float) -> None:
        """A waiting request of a higher class than something running (a person's turn behind
        agents) must not wait for a slot or KV room: preempt the newest running sequence of the
        lowest class below it, and admit again, until it is admitted or nothing is left to take."""
        for _ in range(self.n_seq_max):
            # Not blocked: one waiting on its own conversation, or on a request evaluating the
            # prompt prefix it will copy.
            blocked = [s for s in self.waiting if s.waiting_reason and s.sharer is None
                       and s.waiting_reason != WAITING_FOR_PREVIOUS_TURN]
            if not blocked:
                return
            first = min(blocked, key=lambda s: s.priority)
            victims = [s for s in self.running if s.priority > first.priority]
            if not victims:
                return
            self.preempt(max(victims, key=lambda s: (s.priority, s.admit_order)),
                         f"a {first.priority.label} request needed its room")
            self.admission.hold = False  # the room was freed on purpose, for `first`
            for seq, error in self.admission.admit(now):
                self.finish(seq, DoneReason.ERROR, str(error), error.kind)

    def _running_by_slot(self) -> dict[int | None, Sequence]:
        """The running sequences by seq id (the first one, should two ever share one)."""
        return {s.seq_id: s for s in reversed(self.running)}

    def _relieve_kv(self, plan: BatchPlan) -> None:
        """Apply the remedy KvRelief picks after "no KV slot"."""
        verdict = self.relief.on_no_kv_slot(
            plan, self.running, lambda: self.residency.evict_lru(protect=set()))
        seq = verdict.seq
        if verdict.remedy is Remedy.NO_DRAFTS:
            self.speculator.pause(DRAFT_PAUSE_STEPS)
        elif verdict.remedy is Remedy.PREEMPT:
            assert seq is not None, verdict
            self.preempt(seq)
        elif verdict.remedy is Remedy.GIVE_UP:
            assert seq is not None, verdict
            if seq.output:
                self.finish(seq, DoneReason.LENGTH)
            else:
                self.finish(seq, DoneReason.ERROR, "the KV cache is full: start the engine with a "
                            "larger context (--n-ctx) or shorten the conversation")

    # ---- leak checks ---------------------------------------------------------------------------

    def leaks(self) -> list[str]:
        """What is held beyond idle conversations' resident KV (empty list: nothing leaked)."""
        problems = []
        if self.waiting or self.running:
            problems.append(f"live sequences: waiting={list(self.waiting)} running={self.running}")
        return problems + self.residency.leaks()

    def is_empty(self) -> bool:
        """Nothing at all held: no sequence, no session, no slot, no KV cell."""
        return not self.leaks() and self.residency.is_empty()
