"""Provides what the chosen attention path's kernels cost by a step's shape: the CPU flash kernel's
tile, the few rows of a last partial tile that run apart, and the dense path's score bound. The
backend reads these on every step; the path itself is chosen in `backend.attention`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler.types import SeqSlice

if TYPE_CHECKING:
    from backend.attention import AttentionChoice

# llama.cpp's CPU flash-attention kernel (ggml-cpu ops.cpp, GGML_FA_TILE_Q in this build) runs a
# step's attention as tiled matrix products only when the step has at least this many rows, one
# row at a time below it; deep in a context a smaller step then costs more than a full tile. A
# tiled step computes every tile at full size: the rows of a last, partial tile cost nearly as
# much as a whole one.
CPU_FLASH_TILE_ROWS = 64

# On one thread the kernel tiles each head's rows from the first, so a step's last tile is partial
# when its row count is not a multiple of the tile. Its rows, when they are at most this share of
# a tile, cost less one at a time in a second native call. Measured on one thread, 64 prompt rows
# plus r more in one call or in two (ms): 4,500 deep, r = 1: 1,493 vs 1,050, r = 16: 1,601 vs
# 1,460, r = 24: 1,654 vs 1,703; 1,500 deep, r = 16: 843 vs 785; 300 deep, r = 16: 504 vs 503.
# On two threads the kernel cuts the rows into chunks of its own and the second call lost
# (r = 8, 4,500 deep: 759 vs 819): there the step stays whole.
PARTIAL_TILE_SPLIT = 4  # a tail of at most tile // 4 rows


# On the dense path a step's attention scores every prompt row against every resident cell, one
# float per row, cell and head, and softmaxes them before reading V. Measured on one thread (Xeon,
# SmolLM2-135M, 9 heads): 1,000 prompt rows of a conversation 3,000 deep beside another's 4,400
# cells took 18.6 / 19.2 s in 32-row chunks (a 9 MB score tensor), 21.8 / 20.7 s in 64-row ones,
# 21.5 / 21.9 s in 128 and 22.4 / 22.3 s in 256: past about this many bytes the scores no longer
# stay in the cache between the product and the softmax, and every row pays the memory traffic.
DENSE_KQ_BYTES = 32 * 8192 * 9 * 4


def dense_kq_cells(choice: "AttentionChoice", device_name: str, n_head: int) -> int:
    """Prompt rows x cells whose dense attention scores stay within DENSE_KQ_BYTES (0: flash
    attention, or a GPU, where no such bound was measured)."""
    return DENSE_KQ_BYTES // (4 * max(1, n_head)) if not choice.flash and device_name == "CPU" else 0


def tile_rows(choice: "AttentionChoice", device_name: str) -> int:
    """Rows below which a step's attention runs one row at a time (0: no such threshold known)."""
    return CPU_FLASH_TILE_ROWS if choice.flash and device_name == "CPU" else 0


def partial_tile(prompt: list[SeqSlice], tile: int, beside: int) -> tuple[list[SeqSlice], list[SeqSlice]]:
    """A step's prompt slices cut before the rows of their last, partial attention tile, when
    those rows are few enough to cost less one at a time (see PARTIAL_TILE_SPLIT): (the tiled
    part, the tail), the tail empty when nothing is cut. `beside` is the rows that run with the
    tail (the step's decode rows): with them it must stay under a tile, or it would be tiled too."""
    rows = sum(len(s.tokens) for s in prompt)
    rest = rows % tile if tile else 0
    if rows < tile or rest == 0 or rest > tile // PARTIAL_TILE_SPLIT or rest + beside >= tile:
        return prompt, []
    head: list[SeqSlice] = list(prompt)
    tail: list[SeqSlice] = []
    while rest:
        s = head.pop()
        k = len(s.tokens)
        if k <= rest:
            tail.insert(0, s)
            rest -= k
            continue
        cut = k - rest
        head.append(SeqSlice(s.seq_id, s.pos0, s.tokens[:cut], False, False))
        tail.insert(0, SeqSlice(s.seq_id, s.pos0 + cut, s.tokens[cut:], s.want_logits, False))
        rest = 0
    return head, tail
