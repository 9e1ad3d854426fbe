"""Provides Admission: who leaves the waiting queue, onto which slot, reusing which cached prefix."""

from __future__ import annotations

from collections import deque

from scheduler.ram_tier import MIN_TOKENS as RAM_MIN_TOKENS
from scheduler.residency import Residency
from scheduler.sequence import Sequence, Session, common_prefix_len
from scheduler.types import ErrorKind, Phase

# A prefix shorter than this is not worth a KV copy from another conversation (a chat template's
# opening lines are shared by everyone; the copy is cheap, but so is evaluating a few rows).
MIN_DONOR_PREFIX = 16
# A request waits for another to evaluate a prompt prefix they share (then copies it) only when
# that saves at least this many rows: a shorter one costs less to evaluate than a step's wait.
MIN_SHARED_WAIT = 64
WAITING_FOR_PREVIOUS_TURN = "waiting for the previous turn of this conversation to finish"


class RequestError(ValueError):
    """A request that can never run as asked; the message says what to change."""

    kind = ErrorKind.INVALID


class ContextLengthError(RequestError):
    """The prompt does not fit a sequence, or the whole cache, however long it waits."""

    kind = ErrorKind.CONTEXT_LENGTH


class Admission:
    """First come, first served admission under two limits: a seq slot and KV room.

    A request needs its prompt plus a generation reserve (`min(gen_reserve, max_tokens)`) in cells
    not already used or promised to running sequences. Idle conversations are evicted, least
    recently used, to make room. Nobody overtakes a request waiting for room; a request whose
    conversation is still busy waits without blocking the line. On admission the longer of the
    conversation's own resident KV and a fork parent's committed KV becomes its cached prefix.
    """

    def __init__(self, residency: Residency, waiting: deque[Sequence], running: list[Sequence], *,
                 n_ctx: int, n_ctx_seq: int, n_seq_max: int, gen_reserve: int) -> None:
        self.residency = residency
        self.waiting = waiting  # the scheduler's own queue and running list, shared
        self.running = running
        self.n_ctx = n_ctx
        self.n_ctx_seq = n_ctx_seq
        self.n_seq_max = n_seq_max
        self.gen_reserve = gen_reserve
        self.hold = False  # after a preemption, until something frees KV
        self.num_admitted = 0

    def _from_ram(self, tokens: list[int], shared: int, keep: set) -> bool:
        """The conversation in host memory sharing the longest prefix with `tokens` (its own
        earlier turns, a fork's parent, an agent's history a subagent repeats under a new id)
        takes a slot again, when it spares them more rows than the `shared` ones a resident
        conversation gives already (and more than it would hold a second copy of), a slot is
        free or an idle one not in `keep` can be evicted, and its cells are free. Restoring costs
        a copy; evaluating that history again, seconds. True when it came back."""
        res = self.residency
        session_id, n = res.ram.best_prefix(tokens)
        if session_id is None or min(n, len(tokens) - 1) - shared < max(RAM_MIN_TOKENS, shared):
            return False
        free = res.free_slots()
        while not free and res.evict_lru(keep):
            free = res.free_slots()
        saved = res.ram.tokens(session_id) or []
        return bool(free) and len(saved) <= self.kv_free() and res.restore(session_id, free[0])

    def check(self, seq: Sequence) -> None:
        """RequestError if the request could never run, whatever else is running."""
        n = len(seq.prompt)
        if n == 0:
            raise RequestError("the prompt is empty: send at least one message with some text")
        if seq.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1 (got {seq.max_tokens})")
        limit = min(self.n_ctx_seq, self.n_ctx)
        if n + 1 > limit:
            raise ContextLengthError(
                f"the prompt is {n:,} tokens but a sequence can hold only {limit:,} (prompt plus "
                "reply); shorten the conversation or start the engine with a larger context (--n-ctx)"
            )

    def admit(self, now: float) -> list[tuple[Sequence, "RequestError"]]:
        """Admit what fits, in order; the rest are `queued` with their reason. Returns the requests
        that can never run (or whose KV set-up failed), with the message to end them with."""
        failed: list[tuple[Sequence, RequestError]] = []
        blocked_reason: str | None = None
        # Highest class first, first come first served within a class (the sort is stable).
        for seq in sorted(self.waiting, key=lambda s: s.priority):
            seq.sharer = None
            session = self.residency.sessions.get(seq.session_id)
            if session is not None and session.live not in (None, seq):
                seq.waiting_reason = WAITING_FOR_PREVIOUS_TURN
                continue
            if blocked_reason is not None:
                # First come, first served: nobody overtakes a request waiting for room.
                seq.waiting_reason = blocked_reason
                continue
            seq.sharer = self._sharer(seq)
            if seq.sharer is not None:
                seq.copies_from = seq.sharer
                n = seq.shared_prefix[seq.sharer.admit_order]
                seq.waiting_reason = (f"waiting for {seq.sharer.request_id} to evaluate the {n:,} "
                                      "prompt tokens they share, once; then copies them")
                continue
            if self.hold and self.running:
                blocked_reason = "waiting for KV room (the cache was full; waiting for a reply to end)"
                seq.waiting_reason = blocked_reason
                continue
            try:
                blocked_reason = self._try_admit(seq, now)
            except RequestError as e:
                failed.append((seq, e))
                continue
            except Exception as e:  # a failing KV operation belongs to this request only
                failed.append((seq, RequestError(f"could not set up its KV cache: {e}")))
                continue
            if blocked_reason is not None:
                seq.waiting_reason = blocked_reason
        doomed = {id(seq) for seq, _ in failed}
        for seq in self.waiting:
            if id(seq) not in doomed:
                seq.phase = Phase.QUEUED  # tried and not admitted: it waits, for the reason given
        if not self.running:
            self.hold = False
        return failed

    def _try_admit(self, seq: Sequence, now: float) -> str | None:
        """Admit `seq` if a slot and KV room are available; otherwise say what it waits for."""
        res = self.residency
        tokens = seq.all_tokens()
        cap = len(tokens) - 1  # at least one row must be evaluated to get logits
        own = res.sessions.get(seq.session_id)
        # A later turn of a forked conversation may reuse its parent's prefix again (after its own
        # KV was evicted, that is all that is left of it).
        parent_id = seq.request.fork_from or res.fork_parent.get(seq.session_id)
        parent = res.sessions.get(parent_id) if parent_id and parent_id != seq.session_id else None
        own_cached = own.committed_tokens() if own is not None else []
        own_n = min(common_prefix_len(own_cached, tokens), cap)
        par_n = 0
        if parent is not None and parent.seq_id is not None:
            par_n = min(common_prefix_len(parent.committed_tokens(), tokens), cap)
        donor, don_n = self._best_donor(tokens, cap, exclude={seq.session_id, parent_id}, live=seq.copies_from)
        if don_n > max(own_n, par_n):
            # Another idle conversation already holds a longer prefix of this prompt (an agent
            # re-sending its history under a new id, a shared system prompt): share its cells.
            parent, par_n = donor, don_n
        use_parent = par_n > own_n
        n_reuse = par_n if use_parent else own_n
        protect = {seq.session_id, parent_id, parent.session_id if parent is not None else None}
        if len(res.ram) and len(tokens) - n_reuse > RAM_MIN_TOKENS and self._from_ram(tokens, n_reuse, protect):
            return self._try_admit(seq, now)  # a longer prefix is resident again: choose anew

        slot = own.seq_id if own is not None else None
        while slot is None:
            free_slots = res.free_slots()
            if free_slots:
                slot = free_slots[0]
            elif res.evict_lru(protect):
                continue
            elif parent is not None and not self.running and res.evict_lru({seq.session_id}):
                # Only the idle fork parent holds a slot and nothing will free one: start cold.
                return self._try_admit(seq, now)
            else:
                return f"waiting for a sequence slot (all {self.n_seq_max} in use)"

        need = self.reserved_cells(seq) - n_reuse
        # Cells this admission drops from the session's own cache (approximate: forks may share).
        dropping = len(own_cached) - (0 if use_parent else own_n)
        while need > self.kv_free() + dropping and res.evict_lru(protect):
            pass
        free = self.kv_free() + dropping
        if need > free:
            if self.running:
                return f"waiting for KV room: needs {need:,} cells, {max(0, free):,} free"
            if len(tokens) - n_reuse + 1 > free and parent is not None and parent.is_idle \
                    and res.evict_lru({seq.session_id}):
                # Only the idle fork parent holds the room: drop it and start cold, as a request
                # without fork_from would (the slot case above does the same).
                return self._try_admit(seq, now)
            if len(tokens) - n_reuse + 1 > free:
                raise ContextLengthError(
                    f"the prompt needs {len(tokens) - n_reuse:,} KV cells but the cache has only "
                    f"{max(0, free):,} with nothing else running; start the engine with a larger "
                    "context (--n-ctx) or shorten the conversation"
                )
            # Alone in the cache: run without the full generation reserve; it stops at 'length'.

        res.bind(seq, slot, n_reuse, parent if use_parent else None)
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.seq_id = seq.last_seq_id = slot
        seq.num_computed = seq.num_cached = res.kv.positions(slot)  # n_reuse, or fewer (KvLedger.keep_prefix)
        seq.waiting_reason = None
        self.num_admitted += 1
        seq.admit_order = self.num_admitted
        seq.metrics.on_admit(now)
        seq.refresh_phase()
        return None

    def _sharer(self, seq: Sequence) -> Sequence | None:
        """A running request of the same class or higher still evaluating a prompt prefix it
        shares with `seq`, at least MIN_SHARED_WAIT longer than what `seq` could reuse now
        (subagents spawned over a parent whose latest messages are not in its KV yet, a burst, an
        agent re-sending its history): `seq` waits for it and copies that prefix, so the shared
        rows are evaluated once instead of once per request."""
        res = self.residency
        tokens = seq.prompt
        cap = len(tokens) - 1
        reusable = 0
        for sid in (seq.session_id, seq.request.fork_from or res.fork_parent.get(seq.session_id)):
            held = res.sessions.get(sid) if sid else None
            if held is not None and held.seq_id is not None:
                reusable = max(reusable, common_prefix_len(held.committed_tokens(), tokens))
        for other in self.running:
            if other.priority > seq.priority or other.num_computed >= len(other.prompt):
                continue
            n = seq.shared_prefix.get(other.admit_order)
            if n is None:
                n = seq.shared_prefix[other.admit_order] = min(common_prefix_len(other.prompt, tokens), cap)
            if n - max(reusable, other.num_computed) >= MIN_SHARED_WAIT:
                return other
            if other is seq.copies_from and other.num_computed < n:
                return other  # once waiting, until the whole shared prefix is there to copy
        return None

    def _best_donor(self, tokens: list[int], cap: int, exclude: set,
                    live: Sequence | None = None) -> tuple[Session | None, int]:
        """The resident conversation sharing the longest committed prefix with `tokens` (at least
        MIN_DONOR_PREFIX, at most `cap`), and that length: an idle one, or `live`'s while it runs
        (the `_sharer` this request waited for: its committed rows)."""
        best, best_n = None, 0
        for session in self.residency.sessions.values():
            if session.session_id in exclude or session.seq_id is None:
                continue
            if not session.is_idle and (live is None or session.live is not live):
                continue
            n = min(common_prefix_len(session.committed_tokens(), tokens), cap)
            if n > best_n:
                best, best_n = session, n
        return (best, best_n) if best_n >= MIN_DONOR_PREFIX else (None, 0)

    def reserved_cells(self, seq: Sequence) -> int:
        """KV cells a sequence may come to hold: its tokens, or prompt plus generation reserve."""
        return max(seq.num_tokens, len(seq.prompt) + min(self.gen_reserve, seq.max_tokens))

    def kv_free(self) -> int:
        """Cells neither used nor promised to a running sequence's remaining prompt and reserve."""
        promised = sum(self.reserved_cells(s) - s.num_computed for s in self.running)
        return self.n_ctx - self.residency.kv.cells_used() - promised
