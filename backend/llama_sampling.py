"""Provides LogitRows (a step's logit rows, the context's and those held past a second native call) and Samplers (each sequence's llama.cpp sampler chain and grammar over them)."""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp
import numpy as np

from backend.grammar_sampler import GrammarSampler, candidates, sample_masked
from scheduler.types import Grammar, SamplingParams


class LogitRows:
    """The logit rows of the last step. Most are the context's own, read in place; when a step ran
    as two native calls, the first call's rows are copied before the second and numbered past
    `n_batch` (LlamaBackend.decode)."""

    def __init__(self, ctx, n_vocab: int, n_batch: int) -> None:
        self._ctx, self.n_vocab, self.n_batch = ctx, n_vocab, n_batch
        self.held: dict[int, np.ndarray] = {}
        self._row_type = ctypes.c_float * n_vocab

    def __call__(self, row: int) -> np.ndarray:
        """One row's logits as a numpy array (valid until the next step)."""
        held = self.held.get(row)
        if held is not None:
            return held
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, row)
        if not ptr:  # llama.cpp has no logits for that row: as_array raises, as it always did
            return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        # The view as_array makes, through less Python: read right after llama_decode, with the
        # caches cold, as_array took 0.045 ms a row and this 0.030 (p50, 1 sequence, 1 thread).
        row_buffer = memoryview(self._row_type.from_address(ctypes.addressof(ptr.contents)))
        return np.frombuffer(row_buffer, dtype=np.float32)

    def hold(self, row: int) -> int:
        """Copy a context row before the next native call overwrites it; its number from now on."""
        number = self.n_batch + len(self.held)
        self.held[number] = self(row).copy()
        return number

    def clear(self) -> None:
        self.held.clear()


class Samplers:
    """Each sequence's sampler: greedy (none: the largest logit), or a llama.cpp chain top-k ->
    top-p -> min-p -> temperature -> dist(seed); with a grammar, checked token-first."""

    def __init__(self, ctx, vocab_native, rows: LogitRows) -> None:
        self._ctx, self._vocab, self._rows = ctx, vocab_native, rows
        self._chains: dict[int, ctypes.c_void_p] = {}
        self._grammars: dict[int, GrammarSampler] = {}

    def set(self, seq_id: int, params: SamplingParams, grammar: Grammar | None = None,
            replay: Sequence[int] = ()) -> None:
        self.free(seq_id)
        if grammar is not None:
            self._grammars[seq_id] = GrammarSampler(self._vocab, grammar, replay)
        if params.temperature <= 0:
            return  # greedy: `sample` takes the largest logit, no sampler needed
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if params.top_k > 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
        if 0 < params.top_p < 1:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: random
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        self._chains[seq_id] = chain

    def sample(self, seq_id: int, row: int) -> int:
        chain = self._chains.get(seq_id)
        grammar = self._grammars.get(seq_id)
        if grammar is not None:
            return self._constrained(chain, grammar, row)
        if chain is None:
            # Greedy: the first largest logit, as llama.cpp's greedy sampler picks it, read in place;
            # the sampler would first copy the whole vocabulary into a candidate array (0.11 vs
            # 0.013 ms a row here, and a verification samples up to 9 rows per sequence).
            return int(self._rows(row).argmax())
        return self._chain(chain, row)

    def _chain(self, chain, row: int) -> int:
        """A chain's choice from one row, as llama_sampler_sample makes it (apply, then accept),
        from the context's logits or from a held row."""
        held = self._rows.held.get(row)
        if held is None:
            return int(llama_cpp.llama_sampler_sample(chain, self._ctx, row))
        token = sample_masked(chain, candidates(held))
        llama_cpp.llama_sampler_accept(chain, token)
        return token

    def _constrained(self, chain, grammar: GrammarSampler, row: int) -> int:
        logits = self._rows(row)
        token = int(np.argmax(logits)) if chain is None else self._chain(chain, row)
        if not grammar.allows(token):
            token = grammar.best(logits) if chain is None else sample_masked(chain, grammar.mask(logits))
        grammar.accept(token)
        return token

    def free(self, seq_id: int) -> None:
        grammar = self._grammars.pop(seq_id, None)
        if grammar is not None:
            grammar.close()
        chain = self._chains.pop(seq_id, None)
        if chain is not None:
            llama_cpp.llama_sampler_free(chain)

    def close(self) -> None:
        for seq_id in {*self._chains, *self._grammars}:
            self.free(seq_id)
