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


def with_u32_key(src: Path, dst: Path, key: str, value: int) -> Path:
    """A copy of the GGUF `src` whose uint32 metadata `key` holds `value` (e.g. another EOS id)."""
    data = bytearray(Path(src).read_bytes())
    pos = 4 + 4 + 8  # magic, version, tensor count
    n_kv = struct.unpack_from("<Q", data, pos)[0]
    pos += 8
    scalars = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(kind: int, at: int) -> int:
        if kind in scalars:
            return at + scalars[kind]
        if kind == 8:
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        item, count = struct.unpack_from("<IQ", data, at)
        at += 12
        if item in scalars:
            return at + count * scalars[item]
        for _ in range(count):
            at = skip(item, at)
        return at

    for _ in range(n_kv):
        size = struct.unpack_from("<Q", data, pos)[0]
        name = bytes(data[pos + 8:pos + 8 + size]).decode()
        pos += 8 + size
        kind = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if name == key:
            if kind != 4:
                raise ValueError(f"{key} is not a uint32 in {src}")
            struct.pack_into("<I", data, pos, value)
            Path(dst).write_bytes(bytes(data))
            return Path(dst)
        pos = skip(kind, pos)
    raise KeyError(f"{src} has no metadata key {key}")
