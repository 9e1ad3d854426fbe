"""Provides KvLedger: the scheduler's exact account of the unified KV cache's cells."""

from __future__ import annotations

from typing import Protocol


class KvCache(Protocol):
    """The KV operations the scheduler needs; every Backend provides them."""

    def kv_remove(self, seq_id: int) -> None: ...
    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None: ...
    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None: ...
    def kv_pos_max(self, seq_id: int) -> int: ...
    def kv_load(self, seq_id: int, state: bytes) -> int: ...
    def kv_save(self, seq_id: int) -> bytes: ...

    # True: one pool of cells that every row's attention spans and copies share; False: a stream
    # per sequence (each row reads its own; a copy is the destination's own cells).
    kv_shared_pool: bool


class KvLedger:
    """Issues every KV operation the scheduler makes and mirrors its effect on the cells.

    Why a mirror: in a unified cache `seq_cp` shares cells, so eight forks of a 1,000-token parent
    hold ~1,000 cells, not 9,000; llama.cpp offers no count of distinct cells, and a per-sequence
    sum would refuse admissions that fit. Cells are reference-counted like the native ones: a copy
    shares them, a removal frees those no other sequence holds.
    """

    def __init__(self, kv: KvCache, n_seq_max: int) -> None:
        self.kv = kv
        self.n_seq_max = n_seq_max
        self._cells: dict[int, list[int]] = {s: [] for s in range(n_seq_max)}
        self._refs: dict[int, int] = {}
        self._next_cell = 0
        # exclusive_cells per sequence, counted once and kept while it holds: every step reports the
        # idle conversations' cells, and a count reads every cell they hold.
        self._exclusive: dict[int, int] = {}

    def cells_used(self) -> int:
        return len(self._refs)

    @property
    def shared_pool(self) -> bool:
        """One pool of cells for every sequence (False: a stream per sequence)."""
        return self.kv.kv_shared_pool

    def span_cells(self) -> int:
        """The cells a row reads where it reads every resident one (dense attention): all those in
        use in a shared pool; with a stream per sequence, the fullest stream's (a row reads only
        its own stream)."""
        if self.shared_pool:
            return self.cells_used()
        return max((len(c) for c in self._cells.values()), default=0)

    def positions(self, seq_id: int) -> int:
        return len(self._cells[seq_id])

    def exclusive_cells(self, seq_id: int) -> int:
        """Cells no other sequence shares: what removing this sequence would free."""
        n = self._exclusive.get(seq_id)
        if n is None:
            n = self._exclusive[seq_id] = sum(1 for c in self._cells[seq_id] if self._refs[c] == 1)
        return n

    def remove(self, seq_id: int) -> None:
        self.kv.kv_remove(seq_id)
        self._forget(seq_id, 0)

    def keep_prefix(self, seq_id: int, n_tokens: int) -> int:
        """Keep the sequence's first n_tokens positions; returns how many it holds now, which is
        fewer where the backend could not keep them all (a sliding-window model whose window
        layers lost cells a shorter prefix needs, a recurrent state): the rest is evaluated again."""
        self.kv.kv_keep_prefix(seq_id, n_tokens)
        held = self._held(seq_id, n_tokens)
        self._forget(seq_id, held)
        return held

    def _held(self, seq_id: int, asked: int) -> int:
        """What the backend holds of the `asked` positions just kept, copied or loaded."""
        return min(asked, self.kv.kv_pos_max(seq_id) + 1) if asked > 0 else 0

    def _forget(self, seq_id: int, n_tokens: int) -> None:
        cells = self._cells[seq_id]
        for c in cells[n_tokens:]:
            self._release(c)
        del cells[n_tokens:]
        self._exclusive.pop(seq_id, None)

    def copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        """dst starts as src's first n_tokens positions (sharing their cells, or with cells of its
        own where the backend copies them: a stream per sequence), or fewer where the backend could
        not continue from them (keep_prefix); returns how many."""
        self.kv.kv_copy(src_seq, dst_seq, n_tokens)
        held = self._held(dst_seq, n_tokens)
        for c in self._cells[dst_seq]:
            self._release(c)
        if not self.shared_pool:
            self._cells[dst_seq] = []
            self._exclusive.pop(dst_seq, None)
            self.grow(dst_seq, held)
            return held
        shared = self._cells[src_seq][:held]
        for c in shared:
            self._refs[c] += 1
        self._cells[dst_seq] = list(shared)
        self._exclusive.clear()  # cells src held alone are shared now: count again when asked
        return held

    def save(self, seq_id: int) -> bytes:
        """The sequence's state (its cells' positions, K and V), as the backend copies it."""
        return self.kv.kv_save(seq_id)

    def load(self, seq_id: int, state: bytes, n_tokens: int) -> int:
        """Restore a saved state into `seq_id` and keep its first `n_tokens` positions, or fewer
        where the backend could not continue from them (keep_prefix); returns how many. The cells
        are new (a restored conversation shares none with the ones it was forked from)."""
        self.remove(seq_id)
        try:
            held = self.kv.kv_load(seq_id, state)
            if held < n_tokens:
                raise ValueError(f"the state holds {held} positions, {n_tokens} were expected")
            self.kv.kv_keep_prefix(seq_id, n_tokens)
            held = self._held(seq_id, n_tokens)
        except Exception:
            self.kv.kv_remove(seq_id)
            raise
        self.grow(seq_id, held)
        return held

    def grow(self, seq_id: int, n_tokens: int) -> None:
        """Record rows a successful decode appended to the sequence."""
        cells = self._cells[seq_id]
        for _ in range(n_tokens):
            self._next_cell += 1
            self._refs[self._next_cell] = 1
            cells.append(self._next_cell)
        if seq_id in self._exclusive:
            self._exclusive[seq_id] += n_tokens  # new cells are its alone

    def mismatches(self) -> list[str]:
        """Sequences whose native positions differ from the ledger (should never happen)."""
        out = []
        for s in range(self.n_seq_max):
            native = self.kv.kv_pos_max(s) + 1
            if native != len(self._cells[s]):
                out.append(f"seq {s}: KV holds {native} positions, the ledger {len(self._cells[s])}")
        return out

    def _release(self, cell: int) -> None:
        self._refs[cell] -= 1
        if self._refs[cell] == 0:
            del self._refs[cell]
        elif self._refs[cell] == 1:
            self._exclusive.clear()  # the sequence still holding it now holds it alone
