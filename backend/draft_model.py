"""Provides DraftModelSource: a second model, in its own llama.cpp context, that drafts tokens for
every speculating sequence at once.

Each sequence the engine drafts for gets a slot (a llama.cpp sequence id) in the draft context,
which holds the KV of that sequence's committed tokens. A proposal feeds the committed tokens the
draft has not seen, then runs greedy draft steps, one llama_decode per draft position across all
sequences (8 sequences cost about one step of 8 rows, not 8 steps), and finally removes the draft
positions again: the target decides what is kept, and the next proposal re-feeds what it accepted.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from backend.draft_vocab import DraftModelError, check_draft_vocab
from backend.llama_backend import LlamaBackend
from backend.llama_load import ModelLoadError
from backend.protocol import DecodeOutcome, PlanError
from scheduler.drafts import DraftKind, DraftWant
from scheduler.types import BatchPlan, SeqSlice

__all__ = ["DraftModelSource", "DraftStats", "StepCost"]

# How many of a slot's last held tokens are compared with the committed ones before the slot is
# taken to hold a prefix of them (the usual case: the sequence only grew since the last proposal).
TAIL_CHECK = 64


@dataclass
class DraftStats:
    """What drafting cost so far, for the benchmark and the status line."""

    proposals: int = 0  # sequences drafted for
    drafted: int = 0  # draft tokens proposed
    fed: int = 0  # committed tokens fed to catch up
    steps: int = 0  # llama_decode calls in the draft context
    ms: float = 0.0  # wall time of those calls


@dataclass
class StepCost:
    """A draft step's cost as `fixed_ms + row_ms * rows`, measured at load and kept current by a
    moving correction from every step since (the machine's load changes; the shape does not)."""

    fixed_ms: float
    row_ms: float
    scale: float = 1.0

    def ms(self, rows: int) -> float:
        return self.scale * (self.fixed_ms + self.row_ms * rows)

    def observe(self, rows: int, ms: float) -> None:
        predicted = self.fixed_ms + self.row_ms * rows
        if predicted > 0:
            self.scale += 0.1 * (ms / predicted - self.scale)


@dataclass
class _Held:
    slot: int  # the draft context's sequence id
    tokens: list[int] = field(default_factory=list)  # committed tokens whose KV the slot holds


class DraftModelSource:
    """A DraftSource backed by a draft model (DraftKind.DRAFT_MODEL). One thread calls it (the
    engine's); it owns the draft backend and closes it."""

    kind = DraftKind.DRAFT_MODEL

    def __init__(self, backend: LlamaBackend, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self._b = backend
        self._clock = clock
        self._held: OrderedDict[int, _Held] = OrderedDict()  # least recently drafted first
        self._free = list(range(backend.n_seq_max - 1, -1, -1))
        self.stats = DraftStats()
        self.cost = self._calibrate()
        self.model_name = backend.model_name

    @classmethod
    def load(cls, path: str, target: LlamaBackend, *, device: str = "auto", flash_attn: str = "auto",
             verbose: bool = False, clock: Callable[[], float] = time.perf_counter) -> "DraftModelSource":
        """Load `path` beside `target`: same device and threads, one slot per target slot, a context
        as large as the target's (it holds the same committed tokens). DraftModelError (one line)
        when the file is not a usable draft for the target's vocabulary. `clock` (seconds) times
        its steps for `draft_ms`: the bench's CPU clock on a shared machine, else wall time."""
        check_draft_vocab(target.model_path, path)
        try:
            backend = LlamaBackend.load(model_path=path, device=device, n_ctx=target.n_ctx,
                                        n_seq_max=target.n_seq_max, n_batch=min(target.n_batch, 512),
                                        n_ubatch=min(target.n_ubatch, 512), n_threads=target.n_threads,
                                        flash_attn=flash_attn, verbose=verbose)
        except ModelLoadError as exc:
            raise DraftModelError(f"--draft-model: {exc}") from None
        try:
            return cls(backend, clock=clock)
        except Exception:
            backend.close()
            raise

    def close(self) -> None:
        self._b.close()

    # ---- the DraftSource protocol -------------------------------------------------------------

    def propose(self, key: int, tokens: Sequence[int], k: int) -> list[int]:
        return self.propose_many([DraftWant(key, tokens, k)]).get(key, [])

    def draft_ms(self, k: int, n_sequences: int) -> float:
        """k draft steps of n rows each: the first also feeds what the target accepted last step,
        which adds rows but hardly time (a step's cost is mostly its fixed part and the weights)."""
        return 0.0 if k <= 0 or n_sequences <= 0 else k * self.cost.ms(n_sequences)

    def forget(self, key: int) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            self._b.kv_remove(held.slot)
            self._free.append(held.slot)

    # ---- batched drafting ----------------------------------------------------------------------

    def propose_many(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        """Drafts for several sequences in one go: key -> up to k greedy draft tokens each."""
        out: dict[int, list[int]] = {w.key: [] for w in wants}
        limit = self._b.n_ctx_seq
        live = {}
        for w in wants:
            k = min(w.k, limit - len(w.tokens))  # draft positions must stay inside the context
            if k > 0 and w.tokens:
                live[w.key] = DraftWant(w.key, w.tokens, k)
        holds = self._hold(list(live))
        live = {key: w for key, w in live.items() if key in holds}
        if not live:
            return out
        first = self._catch_up({key: (holds[key], w.tokens) for key, w in live.items()})
        for key, tok in first.items():
            out[key].append(tok)
        # Greedy draft steps: each sequence that wants more, and whose last guess does not end the
        # reply, adds one row; all of them share one llama_decode.
        for _ in range(max((w.k for w in live.values()), default=0) - 1):
            rows = [key for key in first if len(out[key]) < live[key].k and not self._b.is_eog(out[key][-1])]
            if not rows:
                break
            slices = tuple(SeqSlice(holds[key].slot, len(holds[key].tokens) + len(out[key]) - 1,
                                    (out[key][-1],), True, True) for key in rows)
            result = self._decode(slices)
            if result is None:
                break
            for key in rows:
                out[key].append(self._b.sample(holds[key].slot, result.logit_rows[holds[key].slot]))
        for key in first:  # the target decides what is kept; the draft holds only committed tokens
            self._keep(holds[key], len(holds[key].tokens))
        self.stats.proposals += len(first)
        self.stats.drafted += sum(len(out[key]) for key in first)
        return out

    def _hold(self, keys: list[int]) -> dict[int, _Held]:
        """A slot for each key (its old one, a free one, or the least recently drafted one of a
        key not asked for now); a key that gets none is simply not drafted for this time."""
        asked = set(keys)
        holds = {}
        for key in keys:
            held = self._held.get(key)
            if held is None:
                if not self._free:
                    victim = next((k for k in self._held if k not in asked), None)
                    if victim is None:
                        continue
                    self.forget(victim)
                held = self._held[key] = _Held(self._free.pop())
            self._held.move_to_end(key)
            holds[key] = held
        return holds

    def _catch_up(self, seqs: dict[int, tuple[_Held, Sequence[int]]]) -> dict[int, int]:
        """Bring each slot to the committed tokens (keep the common prefix, feed the rest, at least
        the last token, whose logits give the first draft) in decodes of at most n_batch rows;
        key -> first draft token for every sequence that got there."""
        pending: dict[int, list[int]] = {}
        for key, (held, tokens) in seqs.items():
            n = _kept_prefix(held.tokens, tokens)
            if n < len(held.tokens):
                n = self._keep(held, n)
            pending[key] = list(tokens[n:])
        first: dict[int, int] = {}
        while pending:
            room = self._b.n_batch
            slices, done = [], []
            for key, toks in pending.items():
                if room <= 0:
                    break
                held = seqs[key][0]
                take = toks[:room]
                ends = len(take) == len(toks)
                slices.append(SeqSlice(held.slot, len(held.tokens), tuple(take), ends, False))
                room -= len(take)
                if ends:
                    done.append(key)
            result = self._decode(tuple(slices))
            if result is None:
                return first
            for s, key in zip(slices, list(pending)):
                held = seqs[key][0]
                held.tokens.extend(s.tokens)
                self.stats.fed += len(s.tokens)
                del pending[key][:len(s.tokens)]
            for key in done:
                slot = seqs[key][0].slot
                first[key] = self._b.sample(slot, result.logit_rows[slot])
                del pending[key]
        return first

    def _decode(self, slices: tuple[SeqSlice, ...]):
        """One draft step; None when it could not run (no KV room even after dropping idle slots):
        drafting is an optimisation, so a failure only means fewer drafts this time."""
        plan = BatchPlan(step=self.stats.steps, slices=slices, budget=self._b.n_batch)
        by_slot = {h.slot: h for h in self._held.values()}
        for attempt in range(2):
            t0 = self._clock()
            try:
                result = self._b.decode(plan)
            except PlanError:  # the draft's own bookkeeping is off: no drafts, never a failed step
                for s in slices:
                    if s.seq_id in by_slot:
                        self._keep(by_slot[s.seq_id], 0)
                return None
            ms = (self._clock() - t0) * 1000.0
            self.stats.steps += 1
            self.stats.ms += ms
            if result.outcome is DecodeOutcome.OK:
                self.cost.observe(plan.n_rows, ms)
                return result
            for s in slices:  # a failed step may leave part of its rows behind
                if s.seq_id in by_slot:
                    self._keep(by_slot[s.seq_id], s.pos0)
                else:
                    self._b.kv_keep_prefix(s.seq_id, s.pos0)
            if result.outcome is not DecodeOutcome.NO_KV_SLOT or attempt:
                return None
            busy = {s.seq_id for s in slices}
            for key in [k for k, h in self._held.items() if h.slot not in busy]:
                self.forget(key)
        return None

    def _keep(self, held: _Held, n: int) -> int:
        """Keep the slot's first n positions; returns how many it holds, which is fewer where the
        draft model's window layers cannot continue from n (LlamaBackend.kv_keep_prefix empties
        such a sequence): its tokens follow, so the next catch-up feeds what was lost."""
        self._b.kv_keep_prefix(held.slot, n)
        n = min(n, self._b.kv_pos_max(held.slot) + 1)
        del held.tokens[n:]
        return n

    def _calibrate(self) -> StepCost:
        """Time one-row and all-slots draft steps on empty slots (after a warm-up), then clear them."""
        n = self._b.n_seq_max
        token = self._b.tokenize("the")[-1]

        def timed(slots: int) -> float:
            best = float("inf")
            for _ in range(3):
                plan = BatchPlan(0, tuple(SeqSlice(s, 0, (token,), True, True) for s in range(slots)), n)
                t0 = self._clock()
                result = self._b.decode(plan)
                best = min(best, (self._clock() - t0) * 1000.0)
                for s in range(slots):
                    self._b.kv_remove(s)
                if result.outcome is not DecodeOutcome.OK:
                    raise DraftModelError(f"the draft model failed a test step ({result.outcome.value})")
            return best

        timed(1)  # warm-up: first use allocates compute buffers
        one, many = timed(1), timed(n)
        row = max(0.0, (many - one) / (n - 1)) if n > 1 else 0.0
        return StepCost(fixed_ms=max(one - row, 0.0), row_ms=row)


def _kept_prefix(held: list[int], tokens: Sequence[int]) -> int:
    """How many of the slot's held tokens to keep: their common prefix with the committed tokens,
    short of the last committed token (fed again: its logits give the first guess). When the held
    tokens' last TAIL_CHECK agree with the committed ones at the same positions, the slot is taken to
    hold their prefix, so a step reads what is new, not the whole context; otherwise (a rewrite,
    a new turn on the key) the prefix is found token by token. A stale prefix could only make the
    guesses worse: the target verifies every one."""
    limit = min(len(held), len(tokens) - 1)
    tail = max(0, limit - TAIL_CHECK)
    if limit > tail and held[tail:limit] == list(tokens[tail:limit]):
        return limit
    n = 0
    while n < limit and held[n] == tokens[n]:
        n += 1
    return n
