"""Provides tiny GGUF files written from scratch, for tests of the model-file checks."""

from __future__ import annotations

import struct
from pathlib import Path


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def tiny_gguf(path: Path, *, elements: int = 64) -> Path:
    """A valid GGUF v3 file: two metadata keys and one F32 tensor of `elements` values."""
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 2)
    header += _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    header += _string("general.alignment") + struct.pack("<II", 4, 32)
    header += _string("weights") + struct.pack("<I", 1) + struct.pack("<Q", elements)
    header += struct.pack("<IQ", 0, 0)  # type F32, offset 0 in the data section
    header += b"\0" * (-len(header) % 32)
    path.write_bytes(header + struct.pack(f"<{elements}f", *range(elements)))
    return path
