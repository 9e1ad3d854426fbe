"""Provides base_model_copy: the test model's GGUF rewritten as a model with no chat template whose
vocabulary has no ChatML tokens (the markers exist only as text), like a base model."""

from __future__ import annotations

import struct
from pathlib import Path

_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _INT32, _UINT32 = 8, 9, 5, 4
_NORMAL = 1  # llama_token_type LLAMA_TOKEN_TYPE_NORMAL


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> bytes:
        n = self.take("<Q")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def skip_value(self, kind: int) -> None:
        if kind in _SCALARS:
            self.pos += _SCALARS[kind]
        elif kind == _STRING:
            self.string()
        else:
            item, count = self.take("<IQ")
            if item in _SCALARS:
                self.pos += count * _SCALARS[item]
            else:
                for _ in range(count):
                    self.skip_value(item)


def _string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def base_model_copy(src: Path, dst: Path, *, eos_id: int = 0) -> Path:
    """Copy `src` without `tokenizer.chat_template`; the tokens named <|im_start|> and <|im_end|>
    become ordinary tokens whose text is the marker after a space (so llama.cpp neither parses the
    marker as one token nor treats it as end of generation), and EOS becomes `eos_id`. A model
    trained on ChatML then writes " <|im_end|>" as text where it would have ended its turn."""
    data = Path(src).read_bytes()
    r = _Reader(data)
    magic, version, n_tensors, n_kv = r.take("<4sIQQ")
    assert magic == b"GGUF", f"{src} is not a GGUF file"
    kvs: list[bytes] = []
    marker_ids: list[int] = []
    alignment = 32
    for _ in range(n_kv):
        start = r.pos
        name = r.string().decode()
        kind = r.take("<I")
        value_at = r.pos
        if name == "tokenizer.ggml.tokens":
            item, count = r.take("<IQ")
            tokens = [r.string() for _ in range(count)]
            marker_ids = [i for i, t in enumerate(tokens) if t in (b"<|im_start|>", b"<|im_end|>")]
            tokens = [b"\xc4\xa0" + t if i in marker_ids else t for i, t in enumerate(tokens)]  # "Ġ" is a space
            kvs.append(_string(name.encode()) + struct.pack("<IIQ", kind, item, count)
                       + b"".join(_string(t) for t in tokens))
            continue
        r.skip_value(kind)
        raw = data[start:r.pos]
        if name == "tokenizer.chat_template":
            continue
        if name == "general.alignment":
            alignment = struct.unpack_from("<I", data, value_at)[0]
        if name == "tokenizer.ggml.eos_token_id":
            raw = data[start:value_at] + struct.pack("<I", eos_id)
        kvs.append(raw)
    assert len(marker_ids) == 2, "the source model has no ChatML tokens to turn into text"
    kvs = [_token_types(kv, marker_ids) for kv in kvs]
    return write_gguf(dst, data, r, (magic, version, n_tensors), kvs, alignment)


def write_gguf(dst: Path, data: bytes, r: _Reader, head: tuple, kvs: list[bytes], alignment: int) -> Path:
    """Write a GGUF whose key-values are `kvs`, with `data`'s tensors; `r` stands where its tensor
    infos begin."""
    magic, version, n_tensors = head
    tensors_at = r.pos
    for _ in range(n_tensors):
        r.string()
        n_dims = r.take("<I")
        r.pos += 8 * n_dims + 4 + 8
    tensor_infos = data[tensors_at:r.pos]
    data_at = -(-r.pos // alignment) * alignment
    header = struct.pack("<4sIQQ", magic, version, n_tensors, len(kvs)) + b"".join(kvs) + tensor_infos
    header += b"\0" * (-len(header) % alignment)
    Path(dst).write_bytes(header + data[data_at:])
    return Path(dst)


def _token_types(kv: bytes, ids: list[int]) -> bytes:
    """The token-type array with `ids` made NORMAL; any other entry unchanged."""
    r = _Reader(kv)
    if r.string() != b"tokenizer.ggml.token_type":
        return kv
    kind, item, count = r.take("<IIQ")
    assert kind == _ARRAY and item == _INT32
    types = list(struct.unpack_from(f"<{count}i", kv, r.pos))
    for i in ids:
        types[i] = _NORMAL
    return kv[:r.pos] + struct.pack(f"<{count}i", *types)
