"""Provides SimulatedBackend: FakeBackend plus a hardware cost model driving a virtual clock."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from backend.fake import FakeBackend
from backend.protocol import WALL_CLOCK, Clock, DecodeOutcome, DecodeResult
from scheduler.cost_model import CostParams
from scheduler.types import AttentionPath, BatchPlan, plan_kpos


class VirtualClock:
    """Seconds that pass only when the simulated hardware works (or someone sleeps on it)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


@dataclass(frozen=True)
class HardwareProfile:
    """step_ms = fixed_ms + decode_ms * decode_rows + prefill_ms * prefill_rows + attn_ms * kpos,
    where kpos is the thousands of cells the step's rows attend over as `attention` reads them
    (`AttentionPath.FLASH`: each row its own visible positions; `DENSE`: every used cell).

    `tile_rows` models llama.cpp's CPU flash-attention kernel, which runs a step's attention as
    tiles of matrix products only when the step holds at least that many rows (GGML_FA_TILE_Q, 64)
    and one row at a time below it: a step of fewer rows pays `vec_attn_ms` per thousand
    positions instead of `attn_ms`. 0: one price whatever the step's size. A step is priced as
    one call: the llama.cpp backend runs a tiled step of prompt and decode rows as two, which saves
    what a tile pays for the union of its rows' contexts, a cost a linear profile has no term for."""

    name: str
    fixed_ms: float
    decode_ms: float
    prefill_ms: float
    note: str = ""
    attn_ms: float = 0.0
    attention: AttentionPath = AttentionPath.FLASH
    tile_rows: int = 0
    vec_attn_ms: float = 0.0

    def step_ms(self, decode_rows: int, prefill_rows: int, kpos: float = 0.0) -> float:
        one_row_at_a_time = decode_rows + prefill_rows < self.tile_rows
        attn = self.vec_attn_ms if one_row_at_a_time else self.attn_ms
        return self.fixed_ms + self.decode_ms * decode_rows + self.prefill_ms * prefill_rows + attn * kpos


PROFILES: dict[str, HardwareProfile] = {
    # Published figures (docs/design/engine.md): RX 9070 XT, 9B Q4_K_M. Prefill 962 tok/s; a batched
    # decode step with 8 sequences takes 25.7 ms; one sequence alone gets ~1/5 of 8's aggregate
    # rate, i.e. a ~16 ms step, which splits the 25.7 ms into 14.6 fixed + 8 x 1.3875 per row.
    "rx9070xt": HardwareProfile(
        "rx9070xt", fixed_ms=14.6, decode_ms=1.3875, prefill_ms=1000.0 / 962.0,
        note="RX 9070 XT, 9B Q4_K_M: prefill 962 tok/s, 8-sequence decode step 25.7 ms",
    ),
    # Measured by hand on a 2-core CI-class machine: 2 EPYC cores, CPU backend, SmolLM2-135M Q4_1.
    # Prefill ~210 tok/s; decode step ~11 ms for 1 sequence and ~58 ms for 8.
    "cpu2core": HardwareProfile(
        "cpu2core", fixed_ms=4.3, decode_ms=6.7, prefill_ms=1000.0 / 210.0,
        note="2 EPYC cores, SmolLM2-135M Q4_1: prefill ~210 tok/s, decode step 11 ms (1) / 58 ms (8)",
    ),
    # 1 engine thread on the 2 EPYC cores (the app's engine there), flash attention off (what the
    # attention probe picks for decode at depth there), so every row reads every used cell. Source:
    # the calibration `magnitude-bench burst --threads 1 --cpu-clock` fitted on 2026-12-01 (CPU
    # time of the steps): 7.9 ms a step, 8.9 ms a decode row, 7.3 ms a prompt row and 2.0 ms per
    # thousand (row, used cell) pairs. An 11-sequence decode step at depth 2,200 then costs
    # 7.9 + 11 x 8.9 + 2.0 x 11 x 2.3 = 157 ms, 0.32 of it attention.
    "cpu2core-deep": HardwareProfile(
        "cpu2core-deep", fixed_ms=7.9, decode_ms=8.9, prefill_ms=7.3, attn_ms=2.0,
        attention=AttentionPath.DENSE,
        note="1 thread of 2 EPYC cores, SmolLM2-135M Q4_1, flash attention off: every row reads every used cell",
    ),
    # The same thread with flash attention on. Source: the step trace of the burst (11 subagents x
    # 200 tokens over 2,000, CPU time, 2026-12-01): below 64 rows a step runs attention one row at
    # a time (an 11-row decode step at depth 2,200 took 340 ms, 4 decode + 53 prompt rows
    # 1,574 ms), at 64 rows or more in tiles (4 + 60 rows 762 ms, a 512-row chunk at ~2,100
    # 5.9 s): 5 ms a step, 8 ms a decode row, 6 ms a prompt row, 10 ms per thousand positions
    # below the tile and 2.6 at or above it.
    "cpu1thread-flash": HardwareProfile(
        "cpu1thread-flash", fixed_ms=5.0, decode_ms=8.0, prefill_ms=6.0, attn_ms=2.6,
        attention=AttentionPath.FLASH, tile_rows=64, vec_attn_ms=10.0,
        note="1 thread of 2 EPYC cores, SmolLM2-135M Q4_1, flash attention on: steps under 64 rows "
             "run attention one row at a time",
    ),
}


def get_profile(name: str) -> HardwareProfile:
    """Look a profile up by name ("rx9070xt") or backend spec ("simulated:rx9070xt")."""
    key = name.split(":", 1)[1] if name.startswith("simulated:") else name
    try:
        return PROFILES[key]
    except KeyError:
        raise ValueError(
            f"unknown hardware profile {key!r}: choose one of {', '.join(sorted(PROFILES))}"
        ) from None


class SimulatedBackend(FakeBackend):
    """FakeBackend whose steps take the time a hardware profile (or a measured curve) says.

    By default the time passes on a VirtualClock the engine reads: no real sleeping, so minutes
    simulate in milliseconds. With `realtime=True` each step really sleeps and `clock` is wall
    time, for the app's worker process, where a person watches the panes.
    """

    def __init__(
        self,
        profile: str | HardwareProfile = "rx9070xt",
        *,
        clock: VirtualClock | None = None,
        step_ms: Callable[[int, int], float] | None = None,
        n_ctx: int = 65536,
        n_seq_max: int = 16,
        n_batch: int = 8192,
        realtime: bool = False,
        thread_factor: Callable[[int], float] | None = None,
        **kwargs,
    ) -> None:
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        super().__init__(n_ctx=n_ctx, n_seq_max=n_seq_max, n_batch=n_batch,
                         name=f"simulated {self.profile.name}", **kwargs)
        self.realtime = realtime
        self._virtual = None if realtime else (clock or VirtualClock())
        self.clock: Clock = self._virtual or WALL_CLOCK
        self._step_ms = step_ms
        # How much longer a step takes on n threads than the profile says (a busy machine: give it
        # `max_threads` too); None: the thread count changes nothing.
        self._thread_factor = thread_factor
        p = self.profile
        # The profile is the truth: the engine seeds its cost model from it instead of calibrating.
        self.known_costs = CostParams(p.fixed_ms, p.decode_ms, p.prefill_ms, p.attn_ms)
        self.attention_path = p.attention
        self.attention_tile_rows = p.tile_rows

    def decode(self, plan: BatchPlan) -> DecodeResult:
        cells_before = self.kv_cells_used()
        result = super().decode(plan)
        if result.outcome is DecodeOutcome.OK:
            if self._step_ms is not None:
                ms = self._step_ms(plan.n_decode + plan.n_draft, plan.n_prefill)
            else:
                kpos = plan_kpos(plan, self.profile.attention, cells_before)
                # A draft row carries logits like a decode row and costs what one does.
                ms = self.profile.step_ms(plan.n_decode + plan.n_draft, plan.n_prefill, kpos)
        else:
            # A failed llama_decode returns before the compute graph runs: only the fixed cost.
            ms = self.profile.fixed_ms
        if self._thread_factor is not None:
            ms *= self._thread_factor(self.n_threads)
        if self._virtual is None:
            time.sleep(ms / 1000.0)
        else:
            self._virtual.advance(ms / 1000.0)
        result.step_ms = ms
        return result
