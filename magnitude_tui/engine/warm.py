"""Provides WarmResume: the engine's side of warm resume (save idle conversations' KV, restore it)."""

from __future__ import annotations

import logging
import time

from backend.protocol import Backend
from magnitude_tui.engine.events import RestoreOutcome, RestoreSession, SessionRestored
from magnitude_tui.engine.warm_store import Found, WarmStore
from scheduler.planner import Scheduler
from scheduler.retokenized import aligned_prompt
from scheduler.sequence import common_prefix_len

log = logging.getLogger("magnitude_tui.warm")

# A conversation is saved once it has been idle this long: a person reading the reply, not an
# agent about to send its next turn (which would make the copy pointless).
SAVE_AFTER_S = 1.0
# Fewer matching tokens than this are not worth a restore (a chat template's opening lines).
MIN_RESTORE_TOKENS = 16
# At shutdown, the conversations not saved yet are saved for at most this long (the client waits
# for the worker a few seconds more before it kills it).
SHUTDOWN_SAVE_S = 4.0

# Outcomes of ordinary operation (nothing saved yet, a full cache), logged only at info level;
# the others mean a state was there and could not be used, which the log must show.
_EXPECTED = (RestoreOutcome.NOT_SAVED, RestoreOutcome.NO_ROOM)
_FOUND_OUTCOME = {Found.NOTHING: RestoreOutcome.NOT_SAVED, Found.OTHER_LAYOUT: RestoreOutcome.OTHER_LAYOUT,
                  Found.DAMAGED: RestoreOutcome.CORRUPT}


class WarmResume:
    """Owned by the engine and called only from its thread.

    A reply that ends leaves its conversation resident and idle; once it has stayed idle for
    SAVE_AFTER_S, at most one conversation per step has its cells copied out of the KV cache
    (llama.cpp's per-sequence state; a few ms per thousand tokens) and handed with its tokens to
    the store's writer thread. One evicted before then is saved from the host-memory tier, which
    holds the same state (at shutdown too), or not at all when the tier did not keep it. A restore
    loads a state into a free slot through the scheduler, which accounts its cells as any resident
    idle conversation's.
    """

    def __init__(self, backend: Backend, scheduler: Scheduler, store: WarmStore) -> None:
        self.backend = backend
        self.scheduler = scheduler
        self.store = store
        self._idle_since: dict[str, float] = {}  # conversations whose latest reply is not saved yet
        self.save_after_s = SAVE_AFTER_S  # the soak tests save at once, to restore often
        self.last_save_ms = 0.0  # copying the latest saved state out of the KV cache
        self.last_state_bytes = 0
        self.num_saved = 0

    # ---- saving -------------------------------------------------------------------------------

    def went_idle(self, session_id: str, now: float) -> None:
        self._idle_since[session_id] = now

    def tick(self, now: float) -> None:
        """Save the conversation idle longest, if it has been idle `save_after_s` (one per step)."""
        due = [(t, sid) for sid, t in self._idle_since.items() if now - t >= self.save_after_s]
        if due:
            self._save(min(due)[1])

    def save_all(self, budget_s: float = SHUTDOWN_SAVE_S) -> int:
        """Save every conversation not saved yet (the app is quitting), oldest first, for at most
        `budget_s`; then wait for the writer. Returns how many were saved."""
        deadline = time.monotonic() + budget_s
        saved = 0
        for _, sid in sorted((t, sid) for sid, t in self._idle_since.items()):
            if time.monotonic() > deadline:
                log.warning("warm resume: out of time at shutdown; %d conversations not saved",
                            len(self._idle_since))
                break
            saved += self._save(sid)
        self.store.close(max(0.5, deadline - time.monotonic()))
        return saved

    def _save(self, session_id: str) -> bool:
        self._idle_since.pop(session_id, None)
        session = self.scheduler.sessions.get(session_id)
        if session is None:
            # Evicted before it was saved: the host-memory tier may hold the very state.
            held = self.scheduler.residency.ram.peek(session_id)
            if held is None:
                return False  # closed, or evicted with nothing kept
            tokens, state = held
            self.last_save_ms = 0.0
        elif session.is_idle and session.seq_id is not None and session.tokens:
            tokens = session.tokens
            t0 = time.perf_counter()
            try:
                state = self.backend.kv_save(session.seq_id)
            except Exception as exc:  # never worth failing a step over: the next resume is cold
                log.warning("warm resume: could not copy %s's KV: %s", session_id, exc)
                return False
            self.last_save_ms = (time.perf_counter() - t0) * 1000.0
        else:
            return False  # busy again: its next idle moment saves it
        self.last_state_bytes = len(state)
        self.num_saved += 1
        self.store.save(session_id, tokens, state)
        return True

    def forget(self, session_id: str) -> None:
        """The conversation was deleted: nothing of it is saved from now on, and its files go."""
        self._idle_since.pop(session_id, None)
        self.store.discard(session_id)

    # ---- restoring ----------------------------------------------------------------------------

    def restore(self, cmd: RestoreSession) -> SessionRestored:
        sid = cmd.session_id
        t0 = time.perf_counter()

        def answer(outcome: RestoreOutcome, detail: str = "", tokens: int = 0, size: int = 0) -> SessionRestored:
            ms = (time.perf_counter() - t0) * 1000.0
            if outcome in _EXPECTED:
                log.info("warm resume: %s starts cold (%s): %s", sid, outcome.value, detail)
            elif outcome is not RestoreOutcome.RESTORED:
                log.warning("warm resume: %s starts cold (%s): %s", sid, outcome.value, detail)
            return SessionRestored(sid, outcome, tokens=tokens, load_ms=ms, state_bytes=size, detail=detail)

        if sid in self.scheduler.sessions:
            return answer(RestoreOutcome.NO_ROOM, "the conversation is already resident")
        found = self.store.load(sid)
        if found.saved is None:
            return answer(_FOUND_OUTCOME[found.found], found.detail)
        saved = found.saved
        try:
            wanted = self.backend.tokenize_chat(cmd.messages, add_generation_prompt=False)
        except Exception as exc:
            return answer(RestoreOutcome.TOKENS_DIFFER, f"the conversation could not be tokenized: {exc}")
        # A reply the model wrote in other tokens than its text's keeps the saved ones (retokenized.py).
        n = common_prefix_len(saved.tokens, aligned_prompt(list(wanted), [saved.tokens], self.backend.token_bytes))
        if n < MIN_RESTORE_TOKENS:
            return answer(RestoreOutcome.TOKENS_DIFFER, f"the conversation shares {n} of the "
                          f"{len(saved.tokens)} saved tokens (it was edited, or another template)")
        try:
            why = self.scheduler.restore_session(sid, saved.tokens[:n], saved.state)
        except Exception as exc:
            return answer(RestoreOutcome.REFUSED, str(exc))
        if why is not None:
            return answer(RestoreOutcome.NO_ROOM, why)
        return answer(RestoreOutcome.RESTORED, tokens=n, size=len(saved.state),
                      detail="" if n == len(saved.tokens) else f"{len(saved.tokens) - n} saved tokens "
                      "no longer match and were dropped")
