"""Provides the budget policies (prefill-first, fixed:N, target:MS): how many prompt rows a step
may take, priced by the step-cost model (scheduler/cost_model.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from scheduler.cost_model import CostModel
from scheduler.types import AttentionPath, attended_kpos, used_cells_kpos

T = TypeVar("T")

# The figures behind these constants: docs/design/scheduler.md, "Measurements behind the constants".

# When the decode rows alone already exceed the target, prompts still get this many rows per step,
# so a newcomer always has a path to its first token. Not smaller: prompt rows in tiny chunks cost
# far more each, and a smaller floor bought the running sequences little for a much later TTFT.
MIN_PREFILL_QUANTUM = 16

# With nothing generating, target:MS runs every pending prompt row in one step when that step is
# predicted to take at most this long (or MS, if longer): all the waiting prompts then finish
# together and decoding starts at full width, with no chunked tail that costs a fixed step cost
# per few rows. An arrival waits at most this long for the step in flight. Longer work goes in
# micro-batches.
IDLE_MERGE_MS = 2000.0

# The legacy target policy (`target-v1:MS`, kept so `bench burst` can measure what it did) sized
# every step with nothing generating by this (or MS, if longer): at depth on 2 CPU cores that held
# ~20 prompt rows, and prefill ran at a fraction of its rate while eleven subagents waited.
IDLE_STEP_MS = 1000.0

# When the target cannot be met (the decode rows plus one quantum already exceed it), target:MS
# keeps each generating sequence's gap within (1 + GAP_SLACK) x the decode-only step and gives the
# newcomers everything that fits in that: the running sequences keep at least half their rate and
# the prompts get at least as much of the machine as they would alone between two decode steps.
GAP_SLACK = 1.0
# The most a step filled to the attention tile may cost, in decode-only steps: filling it pays
# where small steps are dear (rows attended one at a time), not where every row is.
TILE_STRETCH = 6.0
# ... or the share of a decode-only step that attention takes, for it to pay whatever the tile costs.
ATTENTION_DOMINATES = 0.5


# llama.cpp's CPU flash-attention kernel computes a step's attention in tiles of matrix products
# only when the step holds at least GGML_FA_TILE_Q (64) rows; below that it goes one row at a time.
# Deep in a context that makes a small step dearer than a full tile. The backend says how many rows
# its tile holds (`StepShape.tile_rows`, 0 when it has none). A step of both kinds of rows that
# reaches the tile runs its prompt rows and its decode rows as two native calls (a tile reads every
# cell any of its rows sees), so a prompt fills the tile with its own rows.

@dataclass(frozen=True)
class StepShape:
    """The next step before its prompt rows: what a policy needs to price adding some.

    `decode_kpos` is the visible positions (thousands) the decode rows attend over and
    `prefill_pos0` where the next prompt chunk starts (the deepest prompt, to be safe); under
    `AttentionPath.DENSE` every row instead reads all `cells_used` resident cells plus the step's own.
    """

    decode_rows: int = 0
    decode_kpos: float = 0.0
    prefill_pos0: int = 0
    cells_used: int = 0  # the cells a dense row reads (KvLedger.span_cells: a stream's, with streams)
    path: AttentionPath = AttentionPath.FLASH
    n_batch: int = 2048
    n_ubatch: int = 512
    pending_rows: int = 0  # prompt rows still to evaluate, all prefilling sequences together
    tile_rows: int = 0  # fewer rows than this run attention one row at a time (0: no such kernel)
    kq_cells: int = 0  # dense: the most prompt rows x cells whose attention scores fit the cache (0: no bound)
    # Time sampling will take after the step for rows constrained by a grammar (the mask is
    # checked, and sometimes applied to the whole vocabulary): part of the step a reader waits for.
    sampling_ms: float = 0.0
    # Whether a person paces this step: one of theirs decodes, waits for its first token or for
    # a slot. When none does, only agents wait on the step, and they want throughput (see Policy).
    paced: bool = True

    def kpos(self, prefill_rows: int) -> float:
        """The step's attention work (thousands) with `prefill_rows` prompt rows added."""
        rows = self.decode_rows + prefill_rows
        if self.path is AttentionPath.DENSE:
            return used_cells_kpos(self.cells_used + rows, rows)
        return self.decode_kpos + attended_kpos(self.prefill_pos0, prefill_rows)


class PolicyKind(Enum):
    """Which rule sizes a step's prompt rows (the text before the colon of a policy)."""

    PREFILL_FIRST = "prefill-first"
    FIXED = "fixed"
    TARGET = "target"
    TARGET_V1 = "target-v1"


@dataclass(frozen=True)
class Policy:
    """How many prompt rows a step may hold beside its decode rows.

    - `prefill-first`: the common default. While any prompt rows are pending, a step holds only
      prompt rows (first come, first served, up to n_batch) and every generating sequence waits.
    - `fixed:N`: N prompt rows per step beside the decode rows (the chunk size).
    - `target:MS`: as many prompt rows as the cost model says fit in MS milliseconds beside the
      decode rows, priced at the depth and occupancy the step runs at. When even one quantum does
      not fit (the decode rows alone, deep in a context, can take longer than MS), the step may
      take up to (1 + GAP_SLACK) x the decode-only step instead. With nothing generating, a step
      holds every pending prompt row if that takes at most IDLE_MERGE_MS, else one micro-batch
      (n_ubatch rows, or what fits in MS if more): llama.cpp evaluates a step in micro-batches,
      one runs prefill near its peak rate, and a bigger step only makes an arrival wait longer.
      When no person paces the step (every sequence running or waiting is an agent's or a
      background job's: `StepShape.paced` is false), nobody reads the tokens as they come and
      every one of them waits for whole replies: the step takes as many prompt rows as fit in
      IDLE_MERGE_MS beside the decode rows, and never fewer than one micro-batch (n_ubatch) or one
      attention tile, as llama-server takes a batch, so prompts finish in few steps and decoding
      runs at full width instead of a staggered tail. A person arriving waits for that step (one
      micro-batch, seconds deep in a context on a CPU) as for an idle one.
      On the dense path on a CPU, deep in a pool where attention is most of a prompt row's cost,
      a step's prompt rows stop where their attention scores would outgrow the cache
      (`within_cache`): there a smaller chunk costs less per row.
    - `target-v1:MS`: target:MS as it was before it knew depth and occupancy (16-row floor
      whatever the decode step; up to IDLE_STEP_MS with nothing generating); for comparisons.
    """

    kind: PolicyKind
    value: float = 0.0  # fixed: prompt rows per step; target: milliseconds per step

    def __str__(self) -> str:
        if self.kind is PolicyKind.PREFILL_FIRST:
            return "prefill-first"
        if self.kind is PolicyKind.FIXED:
            return f"fixed:{int(self.value)}"
        return f"{self.kind.value}:{self.value:g}"

    @property
    def is_prefill_first(self) -> bool:
        return self.kind is PolicyKind.PREFILL_FIRST

    @property
    def target_ms(self) -> float | None:
        """The step time a target policy aims at (None for the token-count policies)."""
        return self.value if self.kind in (PolicyKind.TARGET, PolicyKind.TARGET_V1) else None

    @property
    def serves_shortest_first(self) -> bool:
        """Whether prompt rows go to the prompt closest to its first token rather than round-robin:
        each step then completes whom it can, so a burst of subagents starts one after another
        instead of all at the very end (shortest remaining first minimises the mean wait)."""
        return self.kind is PolicyKind.TARGET

    def prefill_allowance(self, shape: StepShape, cost: CostModel) -> int:
        """Prompt rows for the next step beside `shape.decode_rows` decode rows."""
        d = shape.decode_rows
        room = max(0, shape.n_batch - d)
        if self.kind is PolicyKind.PREFILL_FIRST:
            return shape.n_batch
        if self.kind is PolicyKind.FIXED:
            return min(int(self.value), room)
        if self.kind is PolicyKind.TARGET_V1:
            legacy = StepShape(d, shape.decode_kpos, shape.prefill_pos0, n_batch=shape.n_batch)
            target = self.value if d else max(self.value, IDLE_STEP_MS)
            return min(max(MIN_PREFILL_QUANTUM, cost.rows_within(target, legacy)), room)
        return within_cache(self._target_rows(shape, cost), shape, cost)

    def _target_rows(self, shape: StepShape, cost: CostModel) -> int:
        """target:MS's prompt rows before the dense path's cache bound (see prefill_allowance)."""
        d = shape.decode_rows
        room = max(0, shape.n_batch - d)
        if not shape.paced:
            quick = max(self.value, IDLE_MERGE_MS)
            # Never under one micro-batch, nor one attention tile: fewer rows run their attention
            # one at a time, and deep in a context smaller steps cost more per row and hand the
            # other agents' decode rows a native call each that they could have shared after the
            # prompt (figures: docs/design/scheduler.md).
            rows = max(MIN_PREFILL_QUANTUM, cost.rows_within(quick, shape), shape.tile_rows, shape.n_ubatch)
            return whole_tiles(min(rows, room), shape)
        # Aim below the target by what recent steps ran over their prediction, so that the tail,
        # not only the average, stays within it.
        fits = cost.rows_within(max(0.0, self.value - shape.sampling_ms) / cost.overrun(), shape)
        if d == 0:
            # Everything pending in one step, when that is quick: every waiting prompt finishes
            # together and decoding then starts at full width, with no chunked tail.
            everything = min(shape.pending_rows, room)
            quick = max(self.value, IDLE_MERGE_MS)
            if everything and cost.predict(0, everything, shape.kpos(everything)) <= quick:
                return everything
            # One micro-batch, unless that is predicted to take longer than `quick` (deep in a
            # context on a CPU it can take seconds): an arrival never waits longer for the step.
            micro = min(shape.n_ubatch, max(MIN_PREFILL_QUANTUM, cost.rows_within(quick, shape)))
            return min(max(micro, fits), room)
        quantum = cost.predict(d, MIN_PREFILL_QUANTUM, shape.kpos(MIN_PREFILL_QUANTUM))
        if quantum > self.value:  # unreachable: bound the gap by the decode-only step instead
            decode_only = cost.predict(d, 0, shape.kpos(0))
            gap = (1.0 + GAP_SLACK) * decode_only
            fits = max(fits, cost.rows_within(gap, shape))
            # A step short of the attention tile runs every row, decode rows too, one at a time:
            # filling the tile gives the newcomers several times the rows for much less than
            # several times the time. Only where the decode rows alone already miss the target
            # (deep decode rows: their gap is over the target whatever the prompt gets); where
            # they fit and only the prompt's quantum does not, the gap bound stands. And only
            # where attention makes them slow, or the tile is cheap beside them, not where the
            # decode step is slow for another reason, a loaded machine. (A live fit may book the
            # one-row-at-a-time kernel's cost as fixed cost, hence the second test.)
            tile = shape.tile_rows  # the prompt's own: a tiled step runs its decode rows apart
            attention = cost.params.attn_ms * shape.kpos(0) >= ATTENTION_DOMINATES * decode_only
            cheap = cost.predict(d, tile, shape.kpos(tile)) <= TILE_STRETCH * decode_only
            if tile > fits and decode_only > self.value and (attention or cheap):
                fits = tile
            return min(max(MIN_PREFILL_QUANTUM, fits), room)
        return min(max(MIN_PREFILL_QUANTUM, fits), room)


def within_cache(rows: int, shape: StepShape, cost: CostModel) -> int:
    """`rows` cut to what keeps a dense step's attention scores in the cache (`StepShape.kq_cells`
    rows x cells), where attention is most of what the rows cost: deep in a pool on a CPU a
    smaller chunk then costs less per row, not more. Never below MIN_PREFILL_QUANTUM; where the
    rows' own work dominates (a large model, a shallow pool) the chunk stays as it is."""
    if shape.path is not AttentionPath.DENSE or not shape.kq_cells or rows <= MIN_PREFILL_QUANTUM:
        return rows
    cells = shape.cells_used + shape.decode_rows + rows
    bound = max(MIN_PREFILL_QUANTUM, shape.kq_cells // cells)
    p = cost.params
    if bound >= rows or p.attn_ms * used_cells_kpos(cells, rows) < p.prefill_ms * rows:
        return rows
    return bound


def whole_tiles(rows: int, shape: StepShape) -> int:
    """`rows` less the partial attention tile at its end, where it holds a whole tile and more
    prompt rows are pending; and every pending row, where what would be left is under a tile (a
    step of its own then runs it one row at a time). The kernel computes a partial tile at full
    size: deep in a context a step of 244 prompt rows cost about what one of 256 did (a 2,800-token
    prompt on one thread in 2-second steps took 3-6 % longer than in whole tiles); on one thread,
    4,500 deep, 48 prompt rows alone took 1,455 ms and 48 more beside 64 added 1,089."""
    tile = shape.tile_rows
    pending = shape.pending_rows
    if not tile or rows < tile or pending <= rows:
        return rows
    cut = rows - rows % tile
    if pending - cut < tile and pending <= shape.n_batch - shape.decode_rows:
        return pending
    return cut


def parse_policy(text: str) -> Policy:
    """Parse "prefill-first", "fixed:N", "target:MS" or "target-v1:MS"; ValueError says what is accepted."""
    s = text.strip().lower()
    if s == PolicyKind.PREFILL_FIRST.value:
        return Policy(PolicyKind.PREFILL_FIRST)
    name, sep, arg = s.partition(":")
    kind = next((k for k in PolicyKind if k.value == name), None) if sep else None
    try:
        if kind is PolicyKind.FIXED:
            n = int(arg)
            if n >= 1:
                return Policy(kind, float(n))
        elif kind in (PolicyKind.TARGET, PolicyKind.TARGET_V1):
            ms = float(arg)
            if ms > 0 and math.isfinite(ms):
                return Policy(kind, ms)
    except ValueError:
        pass
    raise ValueError(
        f"unknown scheduling policy {text!r}: use 'prefill-first', 'fixed:N' (N prompt rows per "
        "step, N >= 1) or 'target:MS' (target step time in milliseconds, e.g. target:50)"
    )


def as_policy(value: object) -> Policy:
    """A Policy as it is, or parsed from its text ("target:50"); ValueError for anything else."""
    if isinstance(value, Policy):
        return value
    if not isinstance(value, str):
        raise ValueError(f"the policy must be text such as 'target:50', 'fixed:64' or "
                         f"'prefill-first', got {type(value).__name__} {value!r:.60}")
    return parse_policy(value)


def share_rows(order: list[T], pending: list[int], allowance: int, quantum: int) -> list[tuple[T, int]]:
    """Deal `allowance` rows to `order` in turns of at most `quantum` each, never more than an
    item's `pending`; returns (item, rows) for those that got any, in `order`."""
    grant = [0] * len(order)
    left = allowance
    while left > 0:
        gave = 0
        for i, p in enumerate(pending):
            n = min(quantum, p - grant[i], left)
            if n > 0:
                grant[i] += n
                left -= n
                gave += n
        if gave == 0:
            break
    return [(item, g) for item, g in zip(order, grant) if g > 0]
