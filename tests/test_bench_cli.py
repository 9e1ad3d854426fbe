"""The `bench` commands' declarations: every one answers --help, and bad option values stop with a
message that names the option and what it takes, before any model or server starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from magnitude_bench.cli import bench_app

COMMANDS = sorted(c.name or c.callback.__name__ for c in bench_app.registered_commands)


def _bench(*args: str):
    return CliRunner().invoke(bench_app, list(args), env={"COLUMNS": "200"}, prog_name="magnitude-bench")


def test_every_bench_command_is_listed():
    assert COMMANDS == sorted(["admit", "prefill-curve", "throughput", "spec", "fork", "resume", "burst",
                               "target-depth", "serve", "remote", "ui", "ui-cpu", "soak", "contention", "person",
                               "structured", "kv-span", "agents", "report"])


@pytest.mark.parametrize("command", COMMANDS)
def test_bench_command_help(command):
    result = _bench(command, "--help")
    assert result.exit_code == 0, result.output
    assert f"bench {command} [OPTIONS]" in result.output
    assert "--help" in result.output


BAD_VALUES = [
    (["admit", "--fixed", "a,b"], "Invalid value: expected comma-separated integers, got 'a,b'"),
    (["admit", "--targets", "x"], "Invalid value for --targets: expected milliseconds like 50,75, got 'x'"),
    (["prefill-curve", "-b", "nope"],
     "Invalid value for --backend: unknown backend 'nope': use 'llama' or 'simulated:<profile>'"),
    (["throughput", "--peers", "bogus"],
     "Invalid value for --peers: unknown peer 'bogus': choose from batched-bench, server, serial"),
    (["throughput", "--spec", "draft"], "Invalid value for --spec: draft needs a draft model"),
    (["throughput", "--cpu-clock", "-t", "2"],
     "Invalid value for --cpu-clock: CPU-time measurement needs one thread (--threads 1)"),
    (["spec", "--tasks", "poems"], "Invalid value for --tasks: unknown task 'poems': use repetitive, quoting, chat"),
    (["spec", "--modes", "ngram,off"], "Invalid value for --modes: the modes must start with off"),
    (["spec", "--flash-attn", "maybe"], "Invalid value for --flash-attn: expected auto, on or off, got 'maybe'"),
    (["burst", "--flash", "sideways"], "Invalid value for --flash: expected on and/or off, got 'sideways'"),
    (["target-depth", "--cpu-clock", "-t", "2"], "Invalid value for --cpu-clock: CPU-time measurement needs one"),
    (["serve", "--parts", "everything"],
     "Invalid value for --parts: expected some of clients, admission, priority; got 'everything'"),
    (["serve", "--parts", ""], "Invalid value for --parts: expected some of clients, admission, priority; got ''"),
    (["remote", "--url", "ftp://x", "--seqs", "1"], "Invalid value for --url: not a server URL: 'ftp://x'"),
    (["ui", "-b", "wat"], "Invalid value for --backend: unknown backend 'wat': use llama, fake or simulated:<profile>"),
    (["soak", "--only", "nothing"], "Invalid value for --only: unknown scenario 'nothing': choose from machine-fake"),
    (["contention", "--loads", "a"], "Invalid value: expected comma-separated integers, got 'a'"),
    (["agents", "--sides", "serve,vllm"], "Invalid value for --sides: unknown side 'vllm'"),
    (["agents", "--bursts", "sometimes"], "Invalid value for --bursts: use on, off or on,off"),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_values_name_the_option(args, message):
    result = _bench(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output


SIM = ["-b", "simulated:rx9070xt"]
SMOKE = [
    ["spec", *SIM, "--seqs", "1", "--tasks", "repetitive", "--modes", "off,ngram", "--max-tokens", "4", "--no-peer"],
    ["prefill-curve", *SIM, "--chunks", "1,2", "--seqs", "1", "--reps", "1"],
    ["fork", *SIM, "--n", "2", "--parent", "64", "--task", "8", "--gen", "2"],
    ["burst", *SIM, "--n", "2", "--context", "64", "--own", "8", "--gen", "2", "-p", "target:50", "--flash", "off"],
    ["target-depth", *SIM, "--depths", "0", "--n-running", "1", "--newcomer", "32"],
]


@pytest.mark.parametrize("args", SMOKE, ids=[a[0] for a in SMOKE])
def test_a_small_simulated_run_writes_its_results(args, tmp_path):
    # The commands' bodies run end to end on a virtual clock: options to config to result files.
    result = _bench(*args, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert [p.suffix for p in tmp_path.glob(f"{args[0]}-*.json")] == [".json"]
