"""Provides LlamaBackend: one llama.cpp model and one multi-sequence context, driven by plans."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, Sequence

import llama_cpp
import numpy as np

from backend import attention, attention_kernel, llama_load, usable_cpus
from backend.chat import Detokenizer, Vocab
from backend.llama_sampling import LogitRows, Samplers
from backend.protocol import WALL_CLOCK, Clock, DecodeOutcome, DecodeResult, KvStateError, check_plan
from scheduler.types import BatchPlan, Grammar, Message, SamplingParams, Tool


class LlamaBackend:
    """The only owner of native llama.cpp handles. One thread (the engine's) calls it.

    Every plan is checked in Python before llama_decode: the native side asserts (and kills the
    process) on a seq id out of range, a batch over n_batch, or a position gap.
    """

    def __init__(self, *, model, ctx, vocab: Vocab, model_path: str, device_name: str, n_threads: int,
                 choice: attention.AttentionChoice | None = None, owns_model: bool = True,
                 cache_type_v: str = "f16", kv_streams: bool = False):
        self._model = model
        self._owns_model = owns_model  # a probe context borrows the model it measures
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.vocab = vocab
        self.model_path = model_path
        self.model_name = os.path.basename(model_path)
        self.device_name = device_name
        self.name = f"llama.cpp {device_name}"
        self.n_ctx = llama_cpp.llama_n_ctx(ctx)
        # One unified pool: any sequence may grow to the whole context, and a fork shares its
        # parent's cells. A stream per sequence (kv_streams): each holds n_ctx / n_seq_max cells
        # (rounded up to 256 by llama.cpp), and a fork is a copy of its parent's cells.
        self.kv_shared_pool = not kv_streams
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx))
        self.clock: Clock = WALL_CLOCK
        self.known_costs = None  # real hardware: the engine calibrates
        self.n_batch = llama_cpp.llama_n_batch(ctx)
        self.n_ubatch = llama_cpp.llama_n_ubatch(ctx)
        self.n_seq_max = llama_cpp.llama_n_seq_max(ctx)
        self.n_vocab = vocab.n_vocab
        # Sliding-window attention (Gemma 2/3): its layers see only the last n_swa positions, and
        # llama.cpp may reuse a sequence's cells that fell out of its window (see kv_keep_prefix).
        self.n_swa = max(0, llama_cpp.llama_model_n_swa(model))
        self.n_threads = n_threads
        # The engine may choose any count up to what this process may use (or the count asked for,
        # if more: a user who asked for it knows their machine).
        self.max_threads = max(n_threads, usable_cpus())
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # The batch's arrays, viewed once: every row belongs to one sequence, the rest is per step.
        b = self._batch
        self._token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._want = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        self._seq_id = [b.seq_id[i] for i in range(self.n_batch)]  # each row's own seq id array
        self._rows = LogitRows(ctx, vocab.n_vocab, self.n_batch)
        self._samplers = Samplers(ctx, vocab.native, self._rows)
        self._closed = False
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, buf, len(buf))
        self.info = {
            "model_desc": buf.value.decode(errors="replace"),
            "model_size_mb": round(llama_cpp.llama_model_size(model) / 2**20, 1),
            "n_params": llama_cpp.llama_model_n_params(model),
            "n_ctx_train": llama_cpp.llama_model_n_ctx_train(model),
            "n_ubatch": self.n_ubatch,
            "n_threads": n_threads,
        }
        if self.n_swa:
            self.info["sliding_window"] = self.n_swa
        # The attention path this context runs and why; the cost model prices rows by it.
        self.attention = choice or attention.AttentionChoice(False, "not measured")
        self.attention_path = self.attention.path
        self.attention_tile_rows = attention_kernel.tile_rows(self.attention, device_name)
        self.dense_kq_cells = attention_kernel.dense_kq_cells(self.attention, device_name, llama_cpp.llama_model_n_head(model))
        self.info["attention"] = self.attention.short()
        self.tool_syntax = vocab.tool_syntax
        self.info["tool_syntax"] = vocab.tool_syntax.value
        self.info.update(vocab.template_info())  # no chat template: the app tells the user
        self.chat_stops = vocab.chat_stops
        self.info["attention_reason"] = self.attention.summary()
        # A sequence state holds K and V rows as this context lays them out: the model, the build
        # that wrote them, the V type and whether V is transposed (flash attention off).
        self.state_layout = (f"{llama_load.model_identity(model_path)}|{llama_load.build_id()}|k=f16|"
                             f"v={cache_type_v}|flash={'on' if self.attention.flash else 'off'}"
                             # a state records the stream count, and loads only into as many
                             + (f"|kv=streams:{self.n_seq_max}" if kv_streams else ""))
        if kv_streams:
            self.info["kv_layout"] = f"a stream per sequence, {self.n_ctx_seq:,} cells each"

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def load(cls, **options: Any) -> LlamaBackend:
        """Load a model and make its context: backend.llama_load.load (its options), which makes
        this class from what it loaded."""
        return llama_load.load(cls, **options)


    def close(self) -> None:
        """Free children before parents, exactly once."""
        if self._closed:
            return
        self._closed = True
        self._samplers.close()
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self._ctx)
        if self._owns_model:
            llama_cpp.llama_model_free(self._model)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ---- tokens ----------------------------------------------------------------------------

    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        return self.vocab.tokenize(text, special=special, add_bos=add_bos)

    def tokenize_chat(self, messages: Sequence[Message], *, tools: Sequence[Tool] = (),
                      add_generation_prompt: bool = True) -> list[int]:
        return self.vocab.tokenize_chat(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self.vocab)

    def is_eog(self, token: int) -> bool:
        return self.vocab.is_eog(token)

    def token_bytes(self, token: int) -> bytes:
        return self.vocab.piece(token)

    # ---- steps -----------------------------------------------------------------------------

    def check_plan(self, plan: BatchPlan) -> None:
        """Raise PlanError for anything llama_decode would assert on."""
        check_plan(plan, n_batch=self.n_batch, n_seq_max=self.n_seq_max, n_ctx_seq=self.n_ctx_seq,
                   n_vocab=self.n_vocab, next_pos=lambda seq: self.kv_pos_max(seq) + 1)

    def decode(self, plan: BatchPlan) -> DecodeResult:
        """One step. On the CPU flash-attention kernel a step of a tile's rows or more holding
        both prompt and decode rows runs as two native calls, the prompt rows first: that kernel
        takes 64 consecutive rows at a time and reads every cell any of them may see, so a tile
        that mixes one sequence's prompt with other sequences' decode rows pays every one of their
        contexts for all 64 rows. Measured on one thread: 120 prompt rows 1,300 deep beside 3
        decode rows 1,400 deep, 1,607 ms in one call, 1,125 in two; 64 prompt rows beside 16 decode
        rows 400 deep, 1,236 and 600. On one thread the rows of a last, partial tile join the second
        call when they are few (attention_kernel.partial_tile). The step commits both or neither."""
        self.check_plan(plan)
        self._rows.clear()
        tile = self.attention_tile_rows
        tiled = tile and plan.n_rows >= tile
        prompt = [s for s in plan.slices if not s.is_decode] if tiled else []
        second = [s for s in plan.slices if s.is_decode] if prompt else []
        first = prompt
        if prompt and self.n_threads == 1:
            # The rows of a last, partial tile go with the decode rows, one at a time, when few.
            first, tail = attention_kernel.partial_tile(prompt, tile, sum(len(s.tokens) for s in second))
            second = tail + second
        if not first or not second:
            code, step_ms, logit_rows, draft_rows = self._run(plan.slices)
            return self._result(code, step_ms, logit_rows, draft_rows)
        code, first_ms, prompt_rows, _ = self._run(first)
        if code != 0:
            return self._result(code, first_ms, {}, {})
        held = {seq: self._rows.hold(row) for seq, row in prompt_rows.items()}  # read after the second call
        code, second_ms, logit_rows, draft_rows = self._run(second)
        if code != 0:
            for s in prompt:  # the prompt rows' cells go again: the step failed as a whole
                self.kv_keep_prefix(s.seq_id, s.pos0)
            self._rows.clear()
            return self._result(code, first_ms + second_ms, {}, {})
        return self._result(code, first_ms + second_ms, {**held, **logit_rows}, draft_rows)

    def _run(self, slices) -> tuple[int, float, dict[int, int], dict[int, tuple[int, ...]]]:
        """One llama_decode over these slices: its code, wall ms, and each sequence's logit rows."""
        token, pos, want, seq_id = self._token, self._pos, self._want, self._seq_id
        logit_rows: dict[int, int] = {}
        draft_rows: dict[int, tuple[int, ...]] = {}
        row = 0
        if not self.kv_shared_pool:
            # llama.cpp splits a batch over streams into micro-batches of consecutive seq ids, in
            # the batch's order: in any other order each sequence would run a native pass alone.
            slices = sorted(slices, key=lambda s: s.seq_id)
        for s in slices:
            k = len(s.tokens)
            end = row + k
            if k == 1:  # a decode row: element writes cost less than slices
                token[row] = s.tokens[0]
                pos[row] = s.pos0
                want[row] = 0
                seq_id[row][0] = s.seq_id
            else:
                token[row:end] = s.tokens
                pos[row:end] = np.arange(s.pos0, s.pos0 + k, dtype=np.int32)
                want[row:end] = 0
                for ids in seq_id[row:end]:
                    ids[0] = s.seq_id
            if s.want_logits:
                first = end - 1 - s.n_draft  # a decode row verifying drafts: every row after it too
                want[first:end] = 1
                logit_rows[s.seq_id] = first
                if s.n_draft:
                    draft_rows[s.seq_id] = tuple(range(first + 1, end))
            row = end
        b = self._batch
        b.n_tokens = row
        t0 = time.perf_counter()
        code = llama_cpp.llama_decode(self._ctx, b)
        # Vulkan queues work asynchronously: without the sync the time is only the enqueue.
        llama_cpp.llama_synchronize(self._ctx)
        return code, (time.perf_counter() - t0) * 1000.0, logit_rows, draft_rows

    @staticmethod
    def _result(code: int, step_ms: float, logit_rows: dict[int, int],
                draft_rows: dict[int, tuple[int, ...]]) -> DecodeResult:
        outcome = DecodeOutcome.from_code(code)
        ok = outcome is DecodeOutcome.OK
        return DecodeResult(outcome=outcome, step_ms=step_ms, logit_rows=logit_rows if ok else {}, code=code,
                            draft_rows=draft_rows if ok else {})

    def set_n_threads(self, n: int) -> None:
        """Run the next steps (decode and prompt rows alike) on n CPU threads."""
        if not 1 <= n <= self.max_threads:
            raise ValueError(f"thread count {n} outside 1..{self.max_threads}")
        llama_cpp.llama_set_n_threads(self._ctx, n, n)
        self.n_threads = n
        self.info["n_threads"] = n

    def logits(self, logit_row: int) -> np.ndarray:
        """The logits of one batch row as a numpy array (valid until the next decode)."""
        return self._rows(logit_row)

    # ---- sampling (backend/llama_sampling.py) -----------------------------------------------

    def set_sampler(self, seq_id: int, params: SamplingParams, grammar: Grammar | None = None,
                    replay: Sequence[int] = ()) -> None:
        self._samplers.set(seq_id, params, grammar, replay)

    def sample(self, seq_id: int, logit_row: int) -> int:
        return self._samplers.sample(seq_id, logit_row)

    def free_sampler(self, seq_id: int) -> None:
        self._samplers.free(seq_id)

    # ---- KV cache --------------------------------------------------------------------------

    def kv_remove(self, seq_id: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, seq_id, -1, -1)

    def kv_keep_prefix(self, seq_id: int, n_tokens: int) -> None:
        """Keep the first n_tokens positions, or none where they cannot be continued from (then
        kv_pos_max says -1 and the caller evaluates them again)."""
        if n_tokens > self.kv_pos_max(seq_id):
            return  # nothing to remove: a sequence continues from its own end (and a chunked
            # window, Llama 4's, would read as unusable to the check below past its first chunk)
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, n_tokens, -1):
            self.kv_remove(seq_id)  # a recurrent state cannot go back to a position: start over
        self._drop_unusable_window(seq_id)

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> None:
        """dst gets src's first n_tokens positions (in a unified cache the cells are shared, not
        copied), or none where they cannot be continued from, as for kv_keep_prefix."""
        llama_cpp.llama_memory_seq_rm(self._mem, dst_seq, -1, -1)
        if n_tokens <= 0:
            return
        if not self.kv_shared_pool:
            # Another stream. llama_memory_seq_cp would queue a copy of the source's whole stream
            # to the next decode, and until then the fork's state could not be saved, nor a state
            # loaded into either stream without being overwritten by the copy. The source's own
            # cells are copied now instead (its state, loaded into the fork's stream), then cut.
            try:
                self.kv_load(dst_seq, self.kv_save(src_seq))
            except KvStateError:
                return  # nothing held: the fork evaluates its prompt (the ledger reads pos_max)
            self.kv_keep_prefix(dst_seq, n_tokens)
            return
        whole = n_tokens > self.kv_pos_max(src_seq)  # the source's end: as usable as the source
        llama_cpp.llama_memory_seq_cp(self._mem, src_seq, dst_seq, 0, n_tokens)
        if not whole:
            self._drop_unusable_window(dst_seq)

    def _drop_unusable_window(self, seq_id: int) -> None:
        """Empty a sequence whose window layers lack cells its next position must see.

        Placing a step's rows, llama.cpp takes any sequence's cells that lie outside its sliding
        window as seen from its end (those its scan meets before free ones), and drops that
        sequence's positions below them from the window layers (the other layers keep every
        position); a saved state holds only the window's cells of those layers. Its own end never
        needs them, but a prefix ending earlier does. Its next position p sees p - n_swa + 1 .. p - 1, so the kept
        prefix is usable only when the window layers still hold them all; otherwise only a
        prefill from position 0 rebuilds them (llama-server does the same). The window layers'
        pos_max is what kv_pos_max reads: -1 when they kept none of the prefix."""
        if not self.n_swa:
            return
        end = llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id) + 1
        first = llama_cpp.llama_memory_seq_pos_min(self._mem, seq_id)
        if end == 0 or first > max(0, end - self.n_swa + 1):
            self.kv_remove(seq_id)

    def kv_pos_max(self, seq_id: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    def kv_cells_used(self) -> int:
        """Positions held, summed over sequences (a prefix shared by forks counts once per sequence)."""
        return sum(self.kv_pos_max(s) + 1 for s in range(self.n_seq_max))

    def kv_save(self, seq_id: int) -> bytes:
        """llama.cpp's per-sequence state: a copy of the cells (positions, K and V rows) it holds."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq_id)
        buf = bytearray(size)
        n = llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(buf), size, seq_id)
        if n == 0:
            raise KvStateError(f"llama.cpp could not copy the state of seq {seq_id} (see the engine log)")
        del buf[n:]
        return buf  # a bytearray: a state is tens of MB, not copied once more

    def kv_load(self, seq_id: int, state: bytes) -> int:
        size = len(state)
        src = bytearray(state) if isinstance(state, bytes) else state  # ctypes needs a writable buffer
        n = llama_cpp.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(src), size, seq_id)
        if n == 0:
            self.kv_remove(seq_id)
            raise KvStateError(f"llama.cpp refused the saved state for seq {seq_id} (no room, or another "
                               "layout; see the engine log)")
        return self.kv_pos_max(seq_id) + 1
