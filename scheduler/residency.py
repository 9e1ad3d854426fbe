"""Provides Residency: which conversation holds which seq slot, and the KV it keeps between turns."""

from __future__ import annotations

from typing import Callable

from scheduler.cost_model import CostModel
from scheduler.ledger import KvCache, KvLedger
from scheduler.ram_tier import DEFAULT_BYTES, RamTier
from scheduler.sequence import Sequence, Session
from scheduler.types import AttentionPath, used_cells_kpos

MAX_GONE_FORKS = 64  # evicted forks whose parent is remembered for their next turn


class Residency:
    """The seq slots, the conversations (sessions) holding them, and the KV they keep resident.

    A live request holds its conversation's slot. When it ends (normally, or cancelled after some
    rows were committed) the slot and the committed KV stay: an idle session, reused by the next
    turn or a fork, and the first thing evicted (least recently used) when a slot or room is needed.
    Every KV operation goes through the ledger, so the count of cells stays exact.
    """

    def __init__(self, kv: KvCache, n_seq_max: int, ram_bytes: int = DEFAULT_BYTES) -> None:
        self.kv = KvLedger(kv, n_seq_max)
        # Evicted idle conversations' KV in host memory (ram_tier.py): their next turn restores it.
        self.ram = RamTier(ram_bytes)
        self.n_seq_max = n_seq_max
        self.sessions: dict[str, Session] = {}
        self._slot_owner: dict[int, Session] = {}
        # Which conversation each fork started from, kept past eviction: a later turn of an evicted
        # subagent reuses its parent's prefix again and rebuilds only its own rows. Kept only while
        # one side is resident, and for at most MAX_GONE_FORKS evicted children (a server whose
        # every caller forks a shared system prompt added one per caller, for good).
        self.fork_parent: dict[str, str] = {}
        self._tick = 0  # LRU clock for idle sessions

    def free_slots(self) -> list[int]:
        return [s for s in range(self.n_seq_max) if s not in self._slot_owner]

    # ---- a request takes and gives back its conversation's slot ---------------------------------

    def bind(self, seq: Sequence, slot: int, n_reuse: int, parent: Session | None = None) -> Session:
        """`seq` runs on `slot` for its conversation, starting from `n_reuse` tokens of resident KV:
        the fork parent's (shared cells) when `parent` is given, else the conversation's own."""
        own = self.sessions.get(seq.session_id)
        self.ram.drop(seq.session_id)  # running again: a state saved before is out of date
        if parent is not None:
            self.kv.copy(parent.slot, slot, n_reuse)
            self.fork_parent[seq.session_id] = parent.session_id
        elif own is not None and own.seq_id == slot:
            self.kv.keep_prefix(slot, n_reuse)
        else:
            self.kv.remove(slot)
        if own is None:
            own = self.sessions[seq.session_id] = Session(seq.session_id)
        own.seq_id, own.tokens, own.live = slot, [], seq
        own.awaits_tools = False
        own.last_used = self._next_tick()
        self._slot_owner[slot] = own
        return own

    def adopt(self, session_id: str, slot: int, tokens: list[int], state: bytes) -> Session:
        """A conversation's KV comes back from a saved state into free `slot` (its first
        len(tokens) positions): resident and idle, exactly as if its last turn had just ended."""
        assert slot not in self._slot_owner and session_id not in self.sessions
        self.ram.drop(session_id)  # resident again: a state saved before is out of date
        if self.kv.load(slot, state, len(tokens)) < len(tokens):
            self.kv.remove(slot)
            raise ValueError(f"the state's first {len(tokens):,} positions cannot be continued from "
                             "(its sliding-window layers dropped cells they need)")
        session = self.sessions[session_id] = Session(session_id)
        session.seq_id, session.tokens = slot, list(tokens)
        session.last_used = self._next_tick()
        self._slot_owner[slot] = session
        return session

    def retire(self, seq: Sequence, keep: bool) -> None:
        """`seq` ended. With `keep`, its conversation stays resident with exactly the committed
        tokens (rows a step evaluated but never committed are trimmed); otherwise the slot and its
        KV are freed."""
        session = self.sessions.get(seq.session_id)
        if session is None or session.live is not seq:
            return
        session.live = None
        if session.seq_id is not None and keep:
            held = self.kv.keep_prefix(session.seq_id, seq.num_computed)
            session.tokens = seq.committed_tokens()[:held]
            session.last_used = self._next_tick()
            session.rent_ms = 0.0
            session.awaits_tools = seq.called_tools
        elif session.seq_id is not None:
            self.release(session)
        if session.seq_id is None:
            del self.sessions[seq.session_id]
            self._prune_forks()

    def unbind(self, seq: Sequence) -> None:
        """Take a running sequence's slot and KV away (preemption); its conversation stays live."""
        self.release(self.sessions[seq.session_id])

    def close(self, session_id: str) -> None:
        """Forget a conversation and free its slot and KV."""
        session = self.sessions.pop(session_id, None)
        self.fork_parent.pop(session_id, None)
        self.ram.drop(session_id)
        if session is not None and session.seq_id is not None:
            self.release(session)

    def evict_lru(self, protect: set) -> bool:
        """Drop the least recently used idle conversation not in `protect`; False if none. Agents
        that are coming back go last: one whose last reply called tools (it is running them), and a
        parent whose subagents, forked from it, are still running (their answers extend it); a
        finished subagent or a person's answered chat may never return."""
        idle = [s for s in self._slot_owner.values() if s.is_idle and s.session_id not in protect]
        if not idle:
            return False
        waiting = self.waiting_parents()
        victim = min(idle, key=lambda s: (s.awaits_tools or s.session_id in waiting, s.last_used))
        self._stash(victim)
        self.release(victim)
        del self.sessions[victim.session_id]
        self._prune_forks()
        return True

    def _prune_forks(self) -> None:
        """Forget forks whose child and parent are both gone, and all but the newest
        MAX_GONE_FORKS whose child is gone (their parent may still serve its next turn)."""
        gone = [c for c, p in self.fork_parent.items() if c not in self.sessions]
        for child in gone:
            if self.fork_parent[child] not in self.sessions:
                del self.fork_parent[child]
        gone = [c for c in gone if c in self.fork_parent]
        for child in gone[:max(0, len(gone) - MAX_GONE_FORKS)]:  # oldest first (insertion order)
            del self.fork_parent[child]

    def waiting_parents(self) -> set[str]:
        """Conversations that a live fork started from."""
        return {parent for child, parent in self.fork_parent.items()
                if (s := self.sessions.get(child)) is not None and s.live is not None}

    def idle_cells(self) -> int:
        """Cells held only by idle conversations (a prefix a live fork shares is not counted)."""
        return sum(self.kv.exclusive_cells(s.slot) for s in self._slot_owner.values() if s.is_idle)

    def charge_idle_rent(self, step_rows: int, attention: AttentionPath, cost: CostModel) -> list[str]:
        """After a successful step of `step_rows` rows. Without flash attention every row of a step
        reads every resident cell, so an idle conversation's KV slows each running row; once what
        it has cost the running rows since it went idle exceeds what recomputing it would cost, it
        is evicted (the rule that is never worse than twice the better of keeping or dropping it,
        whatever happens next). Returns the evicted conversations' ids."""
        if attention is not AttentionPath.DENSE or cost.params.attn_ms <= 0 or not self.kv.shared_pool:
            return []  # flash rows read their own cells; so does every row in a stream of its own
        used = self.kv.span_cells()
        recompute = lambda n: cost.predict(0, n, used_cells_kpos(used, n))  # noqa: E731
        return self.evict_for_speed(step_rows, cost.params.attn_ms, recompute)

    def evict_for_speed(self, step_rows: int, attn_ms: float,
                        recompute_ms: Callable[[int], float]) -> list[str]:
        """Charge each idle conversation what its cells cost a step of `step_rows` rows that each
        read every resident cell (`attn_ms` per thousand row-cells), and evict those whose charges
        since they went idle exceed `recompute_ms(cells)`, what their next turn would pay to rebuild
        the cells only they hold (a prefix shared with the conversation they forked from stays
        resident while it holds it, and is reused again). Returns the evicted conversations' ids."""
        evicted = []
        for session in [s for s in self._slot_owner.values() if s.is_idle]:
            cells = self.kv.exclusive_cells(session.slot)
            session.rent_ms += attn_ms * step_rows * cells / 1000.0
            if cells and session.rent_ms > recompute_ms(cells):
                self._stash(session)
                self.release(session)
                del self.sessions[session.session_id]
                evicted.append(session.session_id)
        if evicted:
            self._prune_forks()
        return evicted

    def _stash(self, session: Session) -> None:
        """Keep an idle conversation's KV in host memory as it is evicted (when worth it and the
        backend can copy it: a failed copy only means its next turn evaluates it again)."""
        if not self.ram.wants(session.tokens):
            return
        try:
            state = self.kv.save(session.slot)
        except Exception:
            return
        self.ram.put(session.session_id, session.tokens, state)

    def restore(self, session_id: str, slot: int) -> bool:
        """Bring a conversation's KV back from host memory into free `slot`; False (and the saved
        state dropped) when the backend refuses it."""
        saved = self.ram.take(session_id)
        if saved is None:
            return False
        try:
            self.adopt(session_id, slot, *saved)
        except Exception:
            return False
        self.ram.restored_count += 1
        return True

    def release(self, session: Session) -> None:
        self.kv.remove(session.slot)
        del self._slot_owner[session.slot]
        session.seq_id = None
        session.tokens = []

    def trim_orphan(self, slot: int) -> None:
        """A slot whose sequence ended while its step ran keeps only what its owner holds now
        (an idle conversation's committed tokens, or nothing): never that step's rows."""
        owner = self._slot_owner.get(slot)
        if owner is None:
            self.kv.remove(slot)
        elif owner.is_idle:
            del owner.tokens[self.kv.keep_prefix(slot, len(owner.tokens)):]

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    # ---- leak checks ---------------------------------------------------------------------------

    def leaks(self) -> list[str]:
        """Slots and sessions that disagree with each other or with the KV they should hold."""
        problems = []
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
        return not self.sessions and not self._slot_owner and self.kv.cells_used() == 0
