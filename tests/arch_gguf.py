"""Provides arch_model: tiny random-weight GGUFs of other model families (Gemma 2 and 3 with
sliding-window attention, Qwen2), written offline with the test model's tokenizer."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tests.base_model_gguf import _STRING, _Reader, _string

_UINT32, _FLOAT32 = 4, 6
_F32 = 0  # ggml type of every tensor written here
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 2, 16, 128


def _kv(name: str, kind: int, value) -> bytes:
    if kind == _STRING:
        return _string(name.encode()) + struct.pack("<I", kind) + _string(value.encode())
    return _string(name.encode()) + struct.pack("<I" + ("I" if kind == _UINT32 else "f"), kind, value)


def _tokenizer_kvs(src: Path, template: str | None) -> tuple[list[bytes], int]:
    """The tokenizer's key-values of `src` as they are stored (the chat template replaced when
    `template` is given), and its vocabulary size."""
    data = Path(src).read_bytes()
    r = _Reader(data)
    _magic, _version, _n_tensors, n_kv = r.take("<4sIQQ")
    kvs, n_vocab = [], 0
    for _ in range(n_kv):
        start = r.pos
        name = r.string().decode()
        kind = r.take("<I")
        if name == "tokenizer.ggml.tokens":
            n_vocab = r.take("<IQ")[1]
            r.pos -= 12
        r.skip_value(kind)
        if name.startswith("tokenizer.") and not (template is not None and name == "tokenizer.chat_template"):
            kvs.append(data[start:r.pos])
    if template is not None:
        kvs.append(_kv("tokenizer.chat_template", _STRING, template))
    return kvs, n_vocab


def _tensors(arch: str, n_layer: int, n_vocab: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """Random weights, scaled so that activations stay near unit size; norms are ones."""
    rng = np.random.default_rng(seed)

    def mat(n_in: int, n_out: int) -> np.ndarray:  # ggml's ne0 is the row length: numpy (out, in)
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    # Gemma scales its input by sqrt(N_EMBD): the embeddings then have unit size. The layers'
    # outputs are made to outweigh the residual input, or the tied output row of the token just
    # read wins, and a greedy reply repeats one token whatever the context.
    out = [("token_embd.weight", (rng.standard_normal((n_vocab, N_EMBD)) / np.sqrt(N_EMBD)).astype(np.float32)),
           ("output_norm.weight", ones(N_EMBD))]
    if arch != "gemma2":  # gemma2 ties its output to the embeddings; the others may have their own
        out.append(("output.weight", mat(N_EMBD, n_vocab)))
    for i in range(n_layer):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", ones(N_EMBD)), (b + "attn_q.weight", mat(N_EMBD, q)),
                (b + "attn_k.weight", mat(N_EMBD, kv)), (b + "attn_v.weight", mat(N_EMBD, kv)),
                (b + "attn_output.weight", mat(q, N_EMBD)), (b + "ffn_norm.weight", ones(N_EMBD)),
                (b + "ffn_gate.weight", mat(N_EMBD, N_FF)), (b + "ffn_up.weight", mat(N_EMBD, N_FF)),
                (b + "ffn_down.weight", mat(N_FF, N_EMBD))]
        if arch in ("gemma2", "gemma3"):
            out += [(b + "post_attention_norm.weight", 4 * ones(N_EMBD)), (b + "post_ffw_norm.weight", 4 * ones(N_EMBD))]
        if arch == "gemma3":
            out += [(b + "attn_q_norm.weight", ones(HEAD_DIM)), (b + "attn_k_norm.weight", ones(HEAD_DIM))]
        if arch == "qwen2":
            out += [(b + "attn_q.bias", (rng.standard_normal(q) * 0.1).astype(np.float32)),
                    (b + "attn_k.bias", (rng.standard_normal(kv) * 0.1).astype(np.float32)),
                    (b + "attn_v.bias", (rng.standard_normal(kv) * 0.1).astype(np.float32))]
    return out


def arch_model(dst: Path, src: Path, *, arch: str = "gemma2", n_layer: int = 4, sliding_window: int = 16,
               template: str | None = None, seed: int = 0) -> Path:
    """Write a GGUF of `arch` ("gemma2", "gemma3" or "qwen2") with `n_layer` layers of random F32
    weights and the tokenizer (and chat template, or `template`) of the GGUF `src`. The Gemmas
    alternate sliding-window layers of `sliding_window` tokens with global ones (every other
    layer for gemma2; gemma3 here too, by its pattern key)."""
    tok, n_vocab = _tokenizer_kvs(src, template)
    u32 = lambda key, v: _kv(f"{arch}.{key}", _UINT32, v)  # noqa: E731
    kvs = [_kv("general.architecture", _STRING, arch), _kv("general.name", _STRING, f"tiny-{arch}"),
           _kv("general.alignment", _UINT32, 32),
           u32("context_length", 8192), u32("embedding_length", N_EMBD), u32("block_count", n_layer),
           u32("feed_forward_length", N_FF), u32("attention.head_count", N_HEAD),
           u32("attention.head_count_kv", N_HEAD_KV), u32("attention.key_length", HEAD_DIM),
           u32("attention.value_length", HEAD_DIM),
           _kv(f"{arch}.attention.layer_norm_rms_epsilon", _FLOAT32, 1e-6)]
    if arch in ("gemma2", "gemma3"):
        kvs += [u32("attention.sliding_window", sliding_window)]
    if arch == "gemma3":
        kvs += [u32("attention.sliding_window_pattern", 2)]
    if arch == "gemma2":
        kvs += [_kv("gemma2.attn_logit_softcapping", _FLOAT32, 50.0),
                _kv("gemma2.final_logit_softcapping", _FLOAT32, 30.0)]
    kvs += tok
    tensors = _tensors(arch, n_layer, n_vocab, seed)
    infos, blobs, offset = [], [], 0
    for name, a in tensors:
        dims = a.shape[::-1]  # ggml lists the fastest-moving dimension first
        infos.append(_string(name.encode()) + struct.pack("<I", len(dims))
                     + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", _F32, offset))
        raw = a.tobytes()
        pad = -len(raw) % 32
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    header = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kvs)) + b"".join(kvs) + b"".join(infos)
    header += b"\0" * (-len(header) % 32)
    with open(dst, "wb") as f:
        f.write(header)
        for blob in blobs:
            f.write(blob)
    return Path(dst)
