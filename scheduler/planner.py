"""Provides the Scheduler: admission, KV reuse, and which rows go into the next batch."""

from __future__ import annotations

import math
from collections import deque
from scheduler.budget import MIN_PREFILL_QUANTUM, CostModel, Policy, parse_policy, share_rows
from scheduler.ledger import KvCache, KvLedger
from scheduler.sequence import Sequence, Session, common_prefix_len
from scheduler.types import BatchPlan, DoneReason, Phase, SeqSlice, attended_kpos

# A lone sequence whose decode keeps failing for lack of KV room is out of context, not unlucky.
_KV_FAILURES_BEFORE_GIVING_UP = 3


class RequestError(ValueError):
    """A request that can never run as asked; the message says what to change."""


class Scheduler:
    """Decides, step by step, which sequences run and which of their rows go into the batch.

    Depends only on numbers and the KvCache operations: admission (slots, KV room, session and fork
    reuse), decode-first planning under the policy's budget, staged commit, and preemption.
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
    ) -> None:
        if n_seq_max > n_batch:
            raise ValueError(f"n_seq_max ({n_seq_max}) must not exceed n_batch ({n_batch}): every "
                             "generating sequence needs its decode row in each step")
        self.kv = KvLedger(kv, n_seq_max)
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx_seq or n_ctx
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.gen_reserve = gen_reserve
        self.cost = cost or CostModel()
        self.policy = parse_policy(policy) if isinstance(policy, str) else policy
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.sessions: dict[str, Session] = {}
        self._slot_owner: dict[int, Session] = {}
        self._num_steps = 0
        self._num_admitted = 0
        self._tick = 0  # LRU clock for idle sessions
        self._rr = 0  # round-robin start among prefilling sequences
        self._prefill_cap: int | None = None  # shrunk after "no KV slot", relaxed after successes
        self._kv_failures = 0
        self._hold_admission = False  # after a preemption, until something frees KV

    # ---- public state --------------------------------------------------------------------------

    def set_policy(self, policy: str | Policy) -> None:
        self.policy = parse_policy(policy) if isinstance(policy, str) else policy

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def kv_used(self) -> int:
        return self.kv.cells_used()

    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_seq_max) if s not in self._slot_owner]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- requests in and out -------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a tokenized request; RequestError if it could never run."""
        n = len(seq.prompt)
        if n == 0:
            raise RequestError("the prompt is empty: send at least one message with some text")
        if seq.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1 (got {seq.max_tokens})")
        limit = min(self.n_ctx_seq, self.n_ctx)
        if n + 1 > limit:
            raise RequestError(
                f"the prompt is {n:,} tokens but a sequence can hold only {limit:,} (prompt plus "
                "reply); shorten the conversation or start the engine with a larger context (--n-ctx)"
            )
        # It stays `preparing` (template, tokens, cache lookup) until admission is first tried.
        self.waiting.append(seq)

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
        session = self.sessions.pop(session_id, None)
        if session is not None and session.seq_id is not None:
            self._release_slot(session)
        return cancelled

    def finish(self, seq: Sequence, reason: DoneReason, error: str | None = None) -> None:
        """End a request. A reply that ended normally, or was cancelled after some of its rows were
        committed, leaves its committed KV resident for the conversation's next turn; rows a step
        evaluated but never committed are trimmed. An error drops the KV."""
        if seq.is_finished:
            return
        seq.phase, seq.done_reason, seq.error, seq.waiting_reason = Phase.DONE, reason, error, None
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        session = self.sessions.get(seq.session_id)
        if session is not None and session.live is seq:
            session.live = None
            keep = reason in (DoneReason.STOP, DoneReason.LENGTH) or (
                reason is DoneReason.CANCELLED and seq.num_computed > 0)
            if session.seq_id is not None and keep:
                self.kv.keep_prefix(session.seq_id, seq.num_computed)
                session.tokens = seq.committed_tokens()
                session.last_used = self._next_tick()
            elif session.seq_id is not None:
                self._release_slot(session)
            if session.seq_id is None:
                del self.sessions[seq.session_id]
        seq.seq_id = None
        self._hold_admission = False

    def append_token(self, seq: Sequence, token: int) -> None:
        """Record a sampled token; it becomes a decode row in the next plan."""
        seq.output.append(token)
        seq.refresh_phase()

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's KV and slot; it requeues first and later recomputes its
        prompt and every token generated so far (the text already shown stays shown)."""
        session = self.sessions[seq.session_id]
        self._release_slot(session)
        self.running.remove(seq)
        seq.seq_id = None
        seq.num_computed = 0
        seq.num_preemptions += 1
        seq.phase = Phase.QUEUED
        seq.waiting_reason = (f"preempted: the KV cache was full; will recompute its "
                              f"{seq.num_tokens:,} tokens when there is room")
        self.waiting.appendleft(seq)
        self._hold_admission = True

    # ---- one step ------------------------------------------------------------------------------

    def schedule(self, now: float = 0.0) -> BatchPlan | None:
        """Admit what fits, then assemble the next batch: decode rows first, prompt rows after."""
        self._admit(now)
        by_id = sorted(self.running, key=lambda s: s.seq_id)
        decoding = [s for s in by_id if s.is_decoding]
        prefilling = sorted((s for s in self.running if not s.is_decoding), key=lambda s: s.admit_order)
        if self.policy.is_prefill_first and prefilling:
            # The common default: prompts jump the queue and every generating sequence waits.
            decoding = []
            allowance = self.n_batch
            budget = self.n_batch
        else:
            allowance = self.policy.prefill_allowance(
                len(decoding), self.n_batch, self.cost,
                decode_kpos=sum(attended_kpos(s.num_computed, 1) for s in decoding),
                prefill_pos0=max((s.num_computed for s in prefilling), default=0))
            budget = min(self.n_batch, len(decoding) + allowance)
        if self._prefill_cap is not None:
            allowance = min(allowance, self._prefill_cap)
        grants = self._share_prefill(prefilling, allowance)
        slices = [SeqSlice(s.seq_id, s.num_computed, s.token_range(s.num_computed, s.num_tokens),
                           want_logits=True, is_decode=True) for s in decoding]
        for s, n in grants:
            end = s.num_computed + n
            slices.append(SeqSlice(s.seq_id, s.num_computed, s.token_range(s.num_computed, end),
                                   want_logits=end == s.num_tokens, is_decode=False))
        if not slices:
            return None
        for s in [*decoding, *(s for s, _ in grants)]:
            s.metrics.on_scheduled(now)
        self._num_steps += 1
        return BatchPlan(step=self._num_steps, slices=tuple(slices), budget=budget)

    def postprocess(self, plan: BatchPlan, result, error: str | None = None) -> list[Sequence]:
        """Commit a successful step (or undo a failed one); return the sequences to sample now.

        Progress moves only here, after the native decode succeeded, so a failed step leaves the
        scheduler's view equal to the KV cache.
        """
        outcome = getattr(result.outcome, "value", result.outcome)
        planned = [(sl, self._running_at(sl.seq_id)) for sl in plan.slices]
        if outcome == "ok":
            ready = []
            for sl, seq in planned:
                # A sequence cancelled while the step ran is already gone; skip its rows.
                if seq is None:
                    self._trim_orphan(sl.seq_id)
                    continue
                if seq.num_computed != sl.pos0:
                    continue
                seq.num_computed += len(sl.tokens)
                self.kv.grow(sl.seq_id, len(sl.tokens))
                if sl.want_logits:
                    ready.append(seq)
                seq.refresh_phase()
            self.cost.observe(plan.n_decode, plan.n_prefill, result.step_ms, plan.attention_kpos)
            self._kv_failures = 0
            if self._prefill_cap is not None:
                self._prefill_cap *= 2
                if self._prefill_cap >= self.n_batch:
                    self._prefill_cap = None
            return ready
        for sl, seq in planned:
            if seq is not None:
                self.kv.keep_prefix(sl.seq_id, seq.num_computed)
            else:
                self._trim_orphan(sl.seq_id)
        if outcome == "no_kv_slot":
            self._relieve_kv(plan)
        elif outcome != "aborted":
            why = error or f"the backend rejected the batch ({outcome}, code {result.code})"
            for _, seq in planned:
                if seq is not None:
                    self.finish(seq, DoneReason.ERROR, f"{why}; this request was stopped, others go on")
        return []

    # ---- admission -----------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        blocked_reason: str | None = None
        for seq in list(self.waiting):
            session = self.sessions.get(seq.session_id)
            if session is not None and session.live not in (None, seq):
                seq.waiting_reason = "waiting for the previous turn of this conversation to finish"
                continue
            if blocked_reason is not None:
                # First come, first served: nobody overtakes a request waiting for room.
                seq.waiting_reason = blocked_reason
                continue
            if self._hold_admission and self.running:
                blocked_reason = "waiting for KV room (the cache was full; waiting for a reply to end)"
                seq.waiting_reason = blocked_reason
                continue
            try:
                blocked_reason = self._try_admit(seq, now)
            except RequestError as e:
                self.finish(seq, DoneReason.ERROR, str(e))
                continue
            except Exception as e:  # a failing KV operation belongs to this request only
                self.finish(seq, DoneReason.ERROR, f"could not set up its KV cache: {e}")
                continue
            if blocked_reason is not None:
                seq.waiting_reason = blocked_reason
        for seq in self.waiting:
            seq.phase = Phase.QUEUED  # tried and not admitted: it waits, for the reason given
        if not self.running:
            self._hold_admission = False

    def _try_admit(self, seq: Sequence, now: float) -> str | None:
        """Admit `seq` if a slot and KV room are available; otherwise say what it waits for."""
        tokens = seq.all_tokens()
        cap = len(tokens) - 1  # at least one row must be evaluated to get logits
        own = self.sessions.get(seq.session_id)
        parent_id = seq.request.fork_from
        parent = self.sessions.get(parent_id) if parent_id and parent_id != seq.session_id else None
        own_cached = own.committed_tokens() if own is not None else []
        own_n = min(common_prefix_len(own_cached, tokens), cap)
        par_n = 0
        if parent is not None and parent.seq_id is not None:
            par_n = min(common_prefix_len(parent.committed_tokens(), tokens), cap)
        use_parent = par_n > own_n
        n_reuse = par_n if use_parent else own_n
        protect = {seq.session_id, parent_id}

        slot = own.seq_id if own is not None else None
        while slot is None:
            free = self.free_slots()
            if free:
                slot = free[0]
            elif self._evict_lru(protect):
                continue
            elif parent is not None and not self.running and self._evict_lru({seq.session_id}):
                # Only the idle fork parent holds a slot and nothing will free one: start cold.
                return self._try_admit(seq, now)
            else:
                return f"waiting for a sequence slot (all {self.n_seq_max} in use)"

        need = self._reserved_cells(seq) - n_reuse
        # Cells this admission drops from the session's own cache (approximate: forks may share).
        dropping = len(own_cached) - (0 if use_parent else own_n)
        while need > self._kv_free() + dropping and self._evict_lru(protect):
            pass
        free = self._kv_free() + dropping
        if need > free:
            if self.running:
                return f"waiting for KV room: needs {need:,} cells, {max(0, free):,} free"
            if len(tokens) - n_reuse + 1 > free:
                raise RequestError(
                    f"the prompt needs {len(tokens) - n_reuse:,} KV cells but the cache has only "
                    f"{max(0, free):,} with nothing else running; start the engine with a larger "
                    "context (--n-ctx) or shorten the conversation"
                )
            # Alone in the cache: run without the full generation reserve; it stops at 'length'.

        if own is not None and own.seq_id == slot and not use_parent:
            self.kv.keep_prefix(slot, own_n)
        elif use_parent:
            self.kv.copy(parent.seq_id, slot, par_n)
        else:
            self.kv.remove(slot)
        if own is None:
            own = self.sessions[seq.session_id] = Session(seq.session_id)
        own.seq_id, own.tokens, own.live = slot, [], seq
        own.last_used = self._next_tick()
        self._slot_owner[slot] = own
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.seq_id = seq.last_seq_id = slot
        seq.num_computed = seq.num_cached = n_reuse
        seq.waiting_reason = None
        self._num_admitted += 1
        seq.admit_order = self._num_admitted
        seq.metrics.on_admit(now)
        seq.refresh_phase()
        return None

    def _reserved_cells(self, seq: Sequence) -> int:
        """KV cells a sequence may come to hold: its tokens, or prompt plus generation reserve."""
        return max(seq.num_tokens, len(seq.prompt) + min(self.gen_reserve, seq.max_tokens))

    def _kv_free(self) -> int:
        """Cells neither used nor promised to a running sequence's remaining prompt and reserve."""
        promised = sum(self._reserved_cells(s) - s.num_computed for s in self.running)
        return self.n_ctx - self.kv.cells_used() - promised

    def _evict_lru(self, protect: set) -> bool:
        idle = [s for s in self._slot_owner.values() if s.is_idle and s.session_id not in protect]
        if not idle:
            return False
        victim = min(idle, key=lambda s: s.last_used)
        self._release_slot(victim)
        del self.sessions[victim.session_id]
        return True

    def _release_slot(self, session: Session) -> None:
        self.kv.remove(session.seq_id)
        del self._slot_owner[session.seq_id]
        session.seq_id = None
        session.tokens = []

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    # ---- planning helpers ----------------------------------------------------------------------

    def _share_prefill(self, prefilling: list[Sequence], allowance: int) -> list[tuple[Sequence, int]]:
        """First come first served under prefill-first; otherwise bounded quanta starting from a
        different sequence each step (round-robin), so no prompt monopolises the batch."""
        if not prefilling or allowance <= 0:
            return []
        if self.policy.is_prefill_first:
            return share_rows(prefilling, [s.num_pending for s in prefilling], allowance, allowance)
        start = self._rr % len(prefilling)
        self._rr += 1
        order = prefilling[start:] + prefilling[:start]
        quantum = max(MIN_PREFILL_QUANTUM, math.ceil(allowance / len(order)))
        return share_rows(order, [s.num_pending for s in order], allowance, quantum)

    def _trim_orphan(self, slot: int) -> None:
        """A slot whose sequence ended while its step ran keeps only what its owner holds now
        (an idle conversation's committed tokens, or nothing): never the step's rows."""
        owner = self._slot_owner.get(slot)
        if owner is None:
            self.kv.remove(slot)
        elif owner.is_idle:
            self.kv.keep_prefix(slot, len(owner.tokens))

    def _running_at(self, seq_id: int) -> Sequence | None:
        for s in self.running:
            if s.seq_id == seq_id:
                return s
        return None

    def _relieve_kv(self, plan: BatchPlan) -> None:
        """After "no KV slot": retry smaller, then drop an idle cache, then preempt the most
        recently admitted sequence; a lone sequence that still cannot fit has run out of room."""
        self._kv_failures += 1
        if plan.n_prefill > 1:
            self._prefill_cap = max(1, plan.n_prefill // 2)
            return
        if self._evict_lru(protect=set()):
            return
        if len(self.running) > 1:
            self.preempt(max(self.running, key=lambda s: s.admit_order))
            return
        if self.running and self._kv_failures >= _KV_FAILURES_BEFORE_GIVING_UP:
            seq = self.running[0]
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
        for slot, session in self._slot_owner.items():
            if session.seq_id != slot or self.sessions.get(session.session_id) is not session:
                problems.append(f"slot {slot} owned by a stale session {session!r}")
            elif not session.is_idle:
                problems.append(f"slot {slot} held by live {session!r}")
        orphans = [s for s in self.sessions.values() if s.seq_id is None and s.live is None]
        if orphans:
            problems.append(f"sessions holding nothing: {orphans}")
        for slot in self.free_slots():
            if self.kv.positions(slot):
                problems.append(f"free slot {slot} still holds {self.kv.positions(slot)} KV positions")
        for session in self.sessions.values():
            if (session.is_idle and session.seq_id is not None
                    and self.kv.positions(session.seq_id) != len(session.tokens)):
                problems.append(f"{session!r}: KV holds {self.kv.positions(session.seq_id)} positions")
        return problems + self.kv.mismatches()

    def is_empty(self) -> bool:
        """Nothing at all held: no sequence, no session, no slot, no KV cell."""
        return (not self.leaks() and not self.sessions and not self._slot_owner
                and self.kv.cells_used() == 0)
