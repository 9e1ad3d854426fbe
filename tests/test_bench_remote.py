"""`bench remote`: the same burst through any two EngineClients, client-side figures and a ratio."""

from __future__ import annotations

from backend.factory import BackendConfig
from magnitude_bench.common import save_result
from magnitude_bench.remote import RemoteBenchConfig, bench_engines
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.remote.client import RemoteClient
from magnitude_tui.remote.config import RemoteConfig
from tests.openai_stub import Script, StubServer


def test_bench_remote_compares_a_server_with_the_local_engine(tmp_path):
    with StubServer(Script(words=6, delay_s=0.01)) as stub:
        engines = {"remote": RemoteClient(RemoteConfig((stub.url,), max_in_flight=4)),
                   "local": WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=8192)), in_process=True)}
        result = bench_engines(engines, RemoteBenchConfig(seqs=(1, 3), gen=5))
    [rows] = result.tables.values()
    assert [r["seqs"] for r in rows] == [1, 3]
    for row in rows:
        assert row["remote tok/s"] > 0 and row["local tok/s"] > 0 and row["remote TTFT p50 ms"] > 0
        assert row["remote/local"] == round(row["remote tok/s"] / row["local tok/s"], 2)
    made = {(r["engine"], r["seqs"]): r["made"] for r in result.data["runs"]}
    assert made[("remote", 3)] == 15 and made[("local", 3)] == 15  # 3 replies of max_tokens=5 each
    assert len(stub.requests) == 4
    assert save_result(result, tmp_path)["md"].read_text().count("remote/local") == 1


def test_bench_remote_needs_exactly_one_server_source():
    from typer.testing import CliRunner

    from magnitude_bench.cli import bench_app

    runner = CliRunner()
    neither = runner.invoke(bench_app, ["remote", "--seqs", "1"])
    both = runner.invoke(bench_app, ["remote", "--url", "http://127.0.0.1:9", "--llama-server", "2"])
    gpu_peer = runner.invoke(bench_app, ["remote", "--llama-server", "2", "--device", "vulkan"])
    for result in (neither, both):
        assert result.exit_code == 2
        assert "either --url" in result.output
    assert gpu_peer.exit_code == 2 and "CPU peer" in gpu_peer.output


def test_bench_remote_through_the_cli_writes_its_results(tmp_path):
    from typer.testing import CliRunner

    from magnitude_bench.cli import bench_app

    with StubServer(Script(words=4)) as stub:
        result = CliRunner().invoke(bench_app, ["remote", "--url", stub.url, "--seqs", "1,2", "--gen", "3",
                                          "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert len(stub.requests) == 3  # one call at width 1, two at width 2
    assert len(list(tmp_path.glob("remote-*.json"))) == 1
