"""Provides the checks the command line runs on its options and model file before the app opens.

A bad option found inside the engine worker would surface only after the TUI took the terminal,
as a log path on the loading view; here each one is a single line on stderr and a non-zero exit.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from backend import usable_cpus
from backend.model_file import ModelFileError, check_gguf, default_model_path
from magnitude_tui.agents import AgentFileError, AgentSettings, load_agents

# llama.cpp pads a context to a multiple of 256 cells; a smaller or unpadded size would be
# changed behind the user's back (--n-ctx 64 became 256), so such a size is refused instead.
CTX_STEP = 256
MIN_N_CTX = CTX_STEP
# The context when --ctx is left out (BackendConfig's llama default), lowered to the model's
# trained context when that is smaller.
DEFAULT_N_CTX = 8192
DEFAULT_SEQS = 16  # sequences a context holds unless told (BackendConfig.n_seq_max)


class OptionError(ValueError):
    """An option or the model file cannot work; the message is one line naming the option."""


def check_model(model: str | None) -> str:
    """The model path to load (the default model when None); OptionError if it cannot load."""
    try:
        path = model if model is not None else default_model_path()
        check_gguf(path)
    except ModelFileError as exc:
        raise OptionError(f"--model: {exc}") from None
    return path


def trained_context(path: str) -> int | None:
    """The context the model was trained on (`<arch>.context_length` in its GGUF header; None when
    the header does not say or the file cannot be read). Pure Python, reading only the header:
    llama.cpp's vocab-only load leaves the hyperparameters unread."""
    try:
        return check_gguf(path).context_length
    except ModelFileError:
        return None


def check_context(n_ctx: int | None, model_path: str, n_seq_max: int = DEFAULT_SEQS) -> int:
    """The context size to create: --ctx as given, or the default lowered to the model's trained
    context. --ctx is one pool of KV cells that all `n_seq_max` sequences share, so it may exceed
    the trained context (16 sequences of 2,048 tokens in a 32,768 pool), but never what they
    could all use at the trained length: llama.cpp allocates (and clears) every cell at load, so
    --ctx 10000000 would take hundreds of GB before the first token, for nothing."""
    trained = trained_context(model_path)
    if trained is None:
        return DEFAULT_N_CTX if n_ctx is None else n_ctx
    if n_ctx is None:
        return min(DEFAULT_N_CTX, max(MIN_N_CTX, trained // CTX_STEP * CTX_STEP))
    useful = trained * n_seq_max
    if n_ctx > useful:
        largest = max(MIN_N_CTX, useful // CTX_STEP * CTX_STEP)
        raise OptionError(f"--ctx: {n_ctx:,} tokens is more than {n_seq_max} sequences can use at the "
                          f"{trained:,} tokens {os.path.basename(model_path)} was trained on, and llama.cpp "
                          f"would allocate the KV cache for all {n_ctx:,} at load; pass --ctx {largest} or less")
    return n_ctx


MIN_STREAM = 1024  # cells a sequence's own stream holds at the least (--kv-streams)


def check_streams(n_ctx: int, n_seq_max: int) -> None:
    """A stream per sequence splits --ctx evenly (llama.cpp rounds each share up to a multiple of
    CTX_STEP cells): each must hold a real conversation."""
    per_seq = -(-(n_ctx // n_seq_max) // CTX_STEP) * CTX_STEP
    if per_seq < MIN_STREAM:
        raise OptionError(f"--kv-streams: --ctx {n_ctx:,} over --parallel {n_seq_max} leaves each sequence "
                          f"{per_seq:,} cells; pass --ctx {MIN_STREAM * n_seq_max} or more, or a smaller --parallel")


def check_draft_model(draft_model: str | None, model_path: str) -> None:
    """A --draft-model must be a complete GGUF with the model's vocabulary (checked on tokenizer-only
    loads, milliseconds); OptionError names what differs."""
    if draft_model is None:
        return
    try:
        check_gguf(draft_model)
    except ModelFileError as exc:
        raise OptionError(f"--draft-model: {exc}") from None
    try:
        from backend.draft_vocab import DraftModelError, check_draft_vocab
    except ImportError as exc:
        raise OptionError(f"--draft-model: llama-cpp-python is not importable ({exc}); "
                          "run scripts/setup.sh") from None
    try:
        check_draft_vocab(model_path, draft_model)
    except DraftModelError as exc:
        raise OptionError(f"--draft-model: {exc}") from None


def check_device(spec: str) -> None:
    """The device must be auto, cpu, vulkan or vulkan:N, and a Vulkan one must exist here."""
    s = spec.strip().lower()
    if s in ("auto", "cpu"):
        return
    if not re.fullmatch(r"vulkan(:\d+)?", s):
        raise OptionError(f"--device: unknown device {spec!r}; use auto, cpu, vulkan or vulkan:N")
    try:
        from backend import native
    except ImportError as exc:
        raise OptionError(f"--device {spec}: llama-cpp-python is not importable ({exc}); "
                          "run scripts/setup.sh") from None
    try:
        native.select_device(s)
    except native.DeviceError as exc:
        raise OptionError(f"--device {spec}: {exc}") from None


def check_policy(policy: str) -> None:
    from scheduler.budget import parse_policy

    try:
        parse_policy(policy)
    except ValueError as exc:
        raise OptionError(f"--policy: {exc}") from None


def check_megabytes(flag: str, mb: int) -> None:
    """A budget in MB (--kv-disk-mb, --kv-ram-mb): 0 turns it off."""
    if mb < 0:
        raise OptionError(f"{flag}: expected 0 (off) or more, got {mb}")


def check_spec(spec: str, draft_model: str | None = None):
    """The --spec mode; `draft` needs a draft model (said now, not after the model loaded)."""
    from scheduler.speculation import SpecMode, parse_spec_mode

    try:
        mode = parse_spec_mode(spec)
    except ValueError as exc:
        raise OptionError(f"--spec: {exc}") from None
    if mode is SpecMode.DRAFT and draft_model is None:
        raise OptionError("--spec draft needs a draft model: pass --draft-model PATH (a GGUF with the "
                          "model's vocabulary), or use --spec auto or ngram")
    return mode


def check_theme(theme: str | None, available: list[str]) -> None:
    if theme is not None and theme not in available:
        raise OptionError(f"--theme: unknown theme {theme!r}; choose from {', '.join(available)}")


def check_numbers(*, n_ctx: int | None, threads: int | None, temperature: float = 0.0, max_tokens: int = 1,
                  local: bool = True) -> None:
    """The numbers' ranges; `local`: the engine runs here (a remote engine's threads are not ours to count)."""
    if n_ctx is None:
        pass  # the default (check_context)
    elif n_ctx < MIN_N_CTX:
        raise OptionError(f"--n-ctx: {n_ctx} is too small; the smallest context is {MIN_N_CTX} tokens")
    elif n_ctx % CTX_STEP:
        up = -(-n_ctx // CTX_STEP) * CTX_STEP
        raise OptionError(f"--n-ctx: {n_ctx} is not a multiple of {CTX_STEP} (llama.cpp would round "
                          f"it up to {up}); pass --n-ctx {up}")
    if threads is not None and threads < 1:
        raise OptionError(f"--threads: {threads} is not a thread count; use 1 or more (or leave it out)")
    if local and threads is not None and threads > (cpus := usable_cpus()):
        # ggml's threads meet at a spinning barrier after every operation: threads beyond the
        # CPUs wait for each other all the time (--threads 1000 on 2 CPUs never finished loading).
        raise OptionError(f"--threads: {threads} is more than the {cpus} CPU{'s' if cpus > 1 else ''} this "
                          f"process may use, and extra threads only wait for each other at every step; "
                          f"pass --threads {cpus} or less (or leave it out)")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise OptionError(f"--temperature: {temperature} is not allowed; use 0 (greedy) or more")
    if max_tokens < 1:
        raise OptionError(f"--max-tokens: {max_tokens} is too small; a reply needs at least 1 token")


def check_agents(path: Path | None = None) -> dict[str, AgentSettings]:
    """The roles in agents.toml; OptionError (naming the file and the role) if it cannot be used."""
    try:
        return load_agents(path)
    except AgentFileError as exc:
        raise OptionError(f"agents file: {exc}") from None
