"""Provides GrammarSampler: llama.cpp's grammar sampler over one sequence's rows, checked token-first."""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp
import numpy as np

from backend.grammar import GrammarError
from scheduler.types import Grammar

# llama_token_data as numpy lays it out, so a candidate array is written once and handed over.
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
# The shortlists of largest logits a greedy row checks against the grammar, each only past the
# one before it, before it masks the whole vocabulary.
SHORTLISTS = (64, 1024, 16384)


class GrammarSampler:
    """Owns one native grammar sampler (freed exactly once).

    Masking the whole vocabulary costs far more than a step's row; so, as llama.cpp's own
    sampling does, the token chosen freely is checked first and the full mask is applied only when
    the grammar refuses it.
    """

    def __init__(self, vocab, grammar: Grammar, replay: Sequence[int] = ()) -> None:
        self._smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.gbnf.encode(), grammar.root.encode())
        if not self._smpl:
            raise GrammarError("the grammar did not compile (llama.cpp refused it)")
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        for token in replay:
            self.accept(token)

    def allows(self, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def best(self, logits: np.ndarray) -> int:
        """The largest logit the grammar allows, ties to the lowest id: what argmax over `mask`
        picks, looked for among the largest logits first, a widening shortlist at a time (a
        whole-vocabulary mask costs about 4 ms a row on SmolLM2's 49,152 tokens; the grammar's
        choice is most often within the first hundreds, and the one that opens a reply within the
        first tens of thousands)."""
        n = len(logits)
        tiers = [k for k in SHORTLISTS if k < n]
        order = np.argpartition(-logits, tiers) if tiers else np.arange(n)
        lo = 0
        for hi in tiers:
            ids = order[lo:hi]
            cand = candidates(logits, ids)
            self._apply(cand)
            kept = cand["logit"]
            top = kept.max()
            if np.isfinite(top):
                # Every token outside the shortlist is at or below its smallest logit; one equal
                # to it may have a lower id, so a choice at that edge is settled by the whole mask.
                if top > logits[ids].min():
                    return int(ids[kept == top].min())  # ties to the lowest id, as argmax
                break
            lo = hi
        return int(np.argmax(self.mask(logits)["logit"]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """The candidates of every token, those the grammar refuses at -inf."""
        cand = candidates(logits)
        self._apply(cand)
        return cand

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._smpl, token)

    def _apply(self, cand: np.ndarray) -> None:
        arr = llama_cpp.llama_token_data_array(
            data=cand.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(cand), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(arr))

    def close(self) -> None:
        if self._smpl:
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:
        self.close()


def candidates(logits: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """Tokens with their logits, as llama.cpp's samplers take them: every token, or those in `ids`."""
    cand = np.empty(len(logits) if ids is None else len(ids), dtype=_TOKEN_DATA)
    cand["id"] = np.arange(len(logits), dtype=np.int32) if ids is None else ids
    cand["logit"] = logits if ids is None else logits[ids]
    cand["p"] = 0.0
    return cand


def sample_masked(chain, cand: np.ndarray) -> int:
    """A sampler chain's choice among the candidates the grammar left."""
    arr = llama_cpp.llama_token_data_array(
        data=cand.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(cand), selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(arr))
    # The chain may sort and shrink the array in place; `selected` indexes what it left.
    return int(cand["id"][arr.selected])
