"""The attention probe weighs distinct conversations (one deep sequence beside short ones), not only forks."""

from __future__ import annotations

from backend import attention
from backend.attention import PathTiming

KEY = {"model": "/m.gguf", "device": "CPU", "n_threads": 1, "build": "x"}


def _timing(flash: bool, deep: float, mixed: float) -> PathTiming:
    return PathTiming(flash=flash, fill_ms=8300.0, decode_shallow_ms=70.0, decode_deep_ms=deep,
                      chunk_deep_ms=200.0, decode_mixed_ms=mixed)


def test_a_path_that_wins_over_a_shared_prefix_but_pays_for_masked_cells_loses():
    # Over a shared prefix the dense path is a little faster (nothing is masked); with one deep
    # sequence beside seven short ones it multiplies all eight rows by every cell.
    choice = attention.decide((_timing(True, deep=110.0, mixed=60.0), _timing(False, deep=100.0, mixed=105.0)), KEY)
    assert choice.flash
    assert "60 vs 105 ms with one of them that deep" in choice.reason
    on, off = choice.timings
    assert on.reference_ms == 8300.0 + attention.REFERENCE_STEPS * (70.0 + 110.0 + 60.0)


def test_verdicts_measured_by_the_older_probe_are_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGNITUDE_ATTENTION_CACHE", str(tmp_path))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = attention.cache_key(model_path=str(model), device="CPU", n_threads=1, n_ubatch=512, build="x")
    assert key["probe"][-1] == attention.PROBE_VERSION
    old_key = {**key, "probe": key["probe"][:3]}  # what the probe without the mixed step cached
    attention.store(attention.AttentionChoice(False, "old verdict", (_timing(True, 110.0, 0.0),
                                                                     _timing(False, 100.0, 0.0)), key=old_key))
    calls = []

    def measure(flash: bool) -> PathTiming:
        calls.append(flash)
        return _timing(flash, deep=110.0 if flash else 100.0, mixed=60.0 if flash else 105.0)

    choice = attention.choose(key=key, measure=measure)
    assert calls == [True, False] and not choice.cached and choice.flash
