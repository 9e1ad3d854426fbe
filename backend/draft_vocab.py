"""Provides the check that a draft model shares the target model's vocabulary.

A draft model proposes token ids that the target verifies; if the two vocabularies differ, every
id means something else to the target and drafting silently accepts nothing (or, worse, the same
id spells a different word). The check compares what decides that, on vocab-only loads that take
milliseconds, so the command line can refuse a wrong `--draft-model` before the app opens.
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import llama_cpp

from backend import model_path_problem, native

__all__ = ["DraftModelError", "VocabFacts", "vocab_facts", "vocab_mismatch", "read_vocab_facts", "check_draft_vocab"]

# Ordinary prose, code, digits, non-ASCII and the chat template's special tokens: two vocabularies
# that split all of it the same way agree on everything a conversation here produces.
PROBE_TEXT = ("<|im_start|>user\nRename `total_count` to `n_items` in: def f(xs):\n    total_count = 0\n"
              "    for x in xs: total_count += x * 1024  # héllo, naïve café, 東京\n"
              "    return total_count<|im_end|>\n<|im_start|>assistant\n")


class DraftModelError(RuntimeError):
    """The draft model cannot serve the target: unreadable, or a different vocabulary."""


@dataclass(frozen=True)
class VocabFacts:
    """What two models must agree on for draft token ids to mean the same to both."""

    n_vocab: int
    bos: int
    eos: int
    eot: int
    probe: tuple[int, ...]  # PROBE_TEXT tokenized, special tokens parsed


def vocab_facts(vocab_handle) -> VocabFacts:
    """The facts of a loaded llama_vocab."""
    data = PROBE_TEXT.encode()
    n_max = len(data) + 8
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab_handle, data, len(data), buf, n_max, False, True)
    if n < 0:  # more tokens than bytes + 8 cannot happen for a BPE/SPM vocab; treat as a broken one
        raise DraftModelError("the model's tokenizer failed on a probe text")
    return VocabFacts(
        n_vocab=int(llama_cpp.llama_vocab_n_tokens(vocab_handle)),
        bos=int(llama_cpp.llama_vocab_bos(vocab_handle)),
        eos=int(llama_cpp.llama_vocab_eos(vocab_handle)),
        eot=int(llama_cpp.llama_vocab_eot(vocab_handle)),
        probe=tuple(buf[:n]),
    )


def vocab_mismatch(target: VocabFacts, draft: VocabFacts) -> str | None:
    """The first difference that makes the draft's token ids unusable by the target (None: none)."""
    if target.n_vocab != draft.n_vocab:
        return f"its vocabulary has {draft.n_vocab:,} tokens, the model's has {target.n_vocab:,}"
    for name in ("bos", "eos", "eot"):
        a, b = getattr(target, name), getattr(draft, name)
        if a != b:
            return f"its {name} token is {b}, the model's is {a}"
    if target.probe != draft.probe:
        at = next((i for i, (a, b) in enumerate(zip(target.probe, draft.probe)) if a != b),
                  min(len(target.probe), len(draft.probe)))
        return f"it tokenizes a probe text differently (from token {at} on)"
    return None


@contextmanager
def _vocab_only(path: str) -> Iterator[object]:
    """A model loaded without weights (tokenizer only), freed on exit."""
    problem = model_path_problem(path)
    if problem is not None:
        raise DraftModelError(problem)
    native.init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    devs = (ctypes.c_void_p * 1)(None)  # no devices: a tokenizer needs none
    params.devices = ctypes.cast(devs, ctypes.c_void_p)
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise DraftModelError(f"llama.cpp could not load {path} (is it a GGUF model?)")
    try:
        yield model
    finally:
        llama_cpp.llama_model_free(model)


def read_vocab_facts(path: str) -> VocabFacts:
    """The vocabulary facts of a GGUF file, from a tokenizer-only load (milliseconds)."""
    with _vocab_only(path) as model:
        return vocab_facts(llama_cpp.llama_model_get_vocab(model))


def check_draft_vocab(target_path: str, draft_path: str) -> None:
    """DraftModelError (one line, naming the draft file) unless the draft can draft for the target."""
    problem = vocab_mismatch(read_vocab_facts(target_path), read_vocab_facts(draft_path))
    if problem is not None:
        raise DraftModelError(f"{draft_path} cannot draft for {target_path}: {problem}; "
                              "a draft model needs the same vocabulary (the same model family)")
