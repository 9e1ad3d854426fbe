"""The pure-Python GGUF check agrees with llama.cpp: its type table matches libggml, and the real
model passes while a cut copy of it is refused."""

from __future__ import annotations

import ctypes
import os

import pytest

from backend.model_file import GGML_BLOCKS, ModelFileError, check_gguf
from tests.gguf_files import tiny_gguf
from tests.needs import need_real_model


def test_a_tiny_gguf_passes_and_every_cut_of_it_fails(tmp_path):
    good = tiny_gguf(tmp_path / "good.gguf")
    assert check_gguf(str(good)).n_tensors == 1
    data = good.read_bytes()
    for cut in (0, 3, 4, 20, 60, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ModelFileError):
            check_gguf(str(tmp_path / "cut.gguf"))


@pytest.mark.slow
def test_the_type_table_matches_libggml():
    need_real_model()
    import llama_cpp
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    lib.ggml_type_size.restype = ctypes.c_size_t
    lib.ggml_blck_size.restype = ctypes.c_int64
    for kind, block in GGML_BLOCKS.items():
        assert (lib.ggml_blck_size(kind), lib.ggml_type_size(kind)) == block, kind


@pytest.mark.slow
def test_the_real_model_passes_and_a_truncated_copy_is_refused(tmp_path):
    need_real_model()
    from backend.llama_load import default_model_path

    path = default_model_path()
    info = check_gguf(path)
    assert info.architecture == "llama" and info.n_tensors > 100
    cut = tmp_path / "cut.gguf"
    with open(path, "rb") as f:
        cut.write_bytes(f.read(os.path.getsize(path) // 2))
    with pytest.raises(ModelFileError, match="is truncated: tensor"):
        check_gguf(str(cut))
