"""bench throughput: the same fixed work for every peer, well-formed medians and ratios.

llama.cpp's own tools are peers only once scripts/build_llama_tools.sh has built them. Without them
this smoke test runs the engine and serial Llama and says so; set MAGNITUDE_REQUIRE_LLAMA_TOOLS=1
(where the tools are expected to be built) to make their absence a failure instead.
"""

from __future__ import annotations

import os
import warnings

import pytest

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.plots import plot_throughput
from magnitude_bench.throughput import ThroughputConfig, run_throughput
from tests.needs import REQUIRE_TOOLS, llama_tools


@pytest.fixture(autouse=True)
def _no_waiting_for_a_quiet_machine(monkeypatch):
    """Smoke tests check the shape of results, not their speed: never wait for idle cores."""
    monkeypatch.setenv("MAGNITUDE_BENCH_WAIT_QUIET", "0")

pytestmark = pytest.mark.slow


def test_tiny_throughput_against_every_available_peer(tmp_path):
    require = os.environ.get(REQUIRE_TOOLS) == "1"
    found = llama_tools()
    if found is None:
        warnings.warn("llama.cpp tools not built (scripts/build_llama_tools.sh): only the engine and serial "
                      "Llama are compared here")
    cfg = ThroughputConfig(seqs=(1, 2), prompt=16, gen=8, reps=1, policies=("target:50",), require_tools=require)
    res = run_throughput(BackendConfig(kind="llama", device="cpu", n_ctx=1024), cfg)
    want = {"engine target:50", "Llama serial"} | ({"llama-batched-bench", "llama-server -np N"} if found else set())
    assert {m["peer"] for m in res.data["medians"]} == want
    for m in res.data["medians"]:
        assert m["tok_s"] > 0 and m["over_target:50"] > 0
    assert all(r["made"] == r["seqs"] * 8 for r in res.data["runs"])  # exactly the same work everywhere
    prof = next(v for k, v in res.tables.items() if k.startswith("engine step time"))
    assert all(p["native_decode_ms_p50"] > 0 and p["python_ms_p50"] is not None for p in prof)
    paths = save_result(res, tmp_path, plot_throughput)
    assert paths["png"].exists()
    assert "engine ÷ serial" in paths["md"].read_text()
