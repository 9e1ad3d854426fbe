"""The typed seams: one policy parser everywhere, subagent limits from the pane limit, KV-relief
verdicts as enums, a backend that names everything the engine reads, and a bench package that
imports without cycles or private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from backend.factory import BackendConfig, build_backend
from backend.protocol import Backend
from magnitude_tui.commands import parse_slash
from magnitude_tui.screens.policy_dialog import policy_problem
from magnitude_tui.widgets.pane_grid import MAX_PANES, MAX_SUBAGENTS
from scheduler.relief import KvRelief, Remedy
from scheduler.sequence import Sequence
from scheduler.types import BatchPlan, Message, Request, SeqSlice

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("policy", ["target:0", "target:-5", "fixed:0", "target:nan", "fifo"])
def test_the_dialog_and_the_slash_command_reject_what_the_engine_rejects(policy):
    assert policy_problem(policy) is not None
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        parse_slash(f"/policy {policy}")


@pytest.mark.parametrize("policy", ["target:0.5", "fixed:16", "prefill-first", "TARGET:40"])
def test_every_policy_the_engine_takes_is_accepted(policy):
    assert policy_problem(policy) is None
    assert parse_slash(f"/policy {policy}").arg == policy


def test_subagent_limits_follow_from_the_pane_limit():
    assert MAX_SUBAGENTS == MAX_PANES - 1
    assert parse_slash(f"/spawn {MAX_SUBAGENTS} go").count == MAX_SUBAGENTS
    with pytest.raises(ValueError, match=f"between 1 and {MAX_SUBAGENTS}"):
        parse_slash(f"/spawn {MAX_PANES} go")
    with pytest.raises(ValueError, match=f"between 1 and {MAX_SUBAGENTS}"):
        parse_slash(f"/burst {MAX_PANES}")


def _seq(rid: str, order: int) -> Sequence:
    seq = Sequence(Request(rid, rid, (Message("user", "x"),)), [1, 2, 3], t_submit=0.0)
    seq.admit_order = order
    return seq


def test_kv_relief_verdicts_are_enums_in_their_order_of_preference():
    relief = KvRelief(n_batch=64)
    wide = BatchPlan(1, (SeqSlice(0, 0, (1,) * 8, True, False),), 8)
    narrow = BatchPlan(2, (SeqSlice(0, 0, (1,), True, True),), 1)
    a, b = _seq("a", 0), _seq("b", 1)
    assert relief.on_no_kv_slot(wide, [a, b], lambda: True).remedy is Remedy.SMALLER
    assert relief.cap(100) == 4
    assert relief.on_no_kv_slot(narrow, [a, b], lambda: True).remedy is Remedy.EVICTED
    verdict = relief.on_no_kv_slot(narrow, [a, b], lambda: False)
    assert verdict.remedy is Remedy.PREEMPT and verdict.seq is b  # the most recently admitted
    relief = KvRelief(n_batch=64)
    assert relief.on_no_kv_slot(narrow, [a], lambda: False).remedy is Remedy.WAIT
    relief.on_no_kv_slot(narrow, [a], lambda: False)
    verdict = relief.on_no_kv_slot(narrow, [a], lambda: False)
    assert verdict.remedy is Remedy.GIVE_UP and verdict.seq is a


@pytest.mark.parametrize("kind", ["fake", "simulated:cpu2core"])
def test_a_backend_names_everything_the_engine_reads(kind):
    backend = build_backend(BackendConfig(kind, n_ctx=1024))
    for name in Backend.__annotations__:
        assert hasattr(backend, name), name
    assert backend.n_ctx_seq == backend.n_ctx == 1024
    assert callable(backend.clock) and callable(backend.clock.sleep)
    assert (backend.known_costs is None) == (kind == "fake")


def test_the_engine_reads_no_backend_attribute_by_getattr():
    source = (ROOT / "magnitude_tui/engine/core.py").read_text() + (ROOT / "magnitude_tui/engine/worker.py").read_text()
    assert "getattr(backend" not in source and "getattr(self.backend" not in source


def test_the_bench_package_has_no_import_cycle_and_no_private_imports():
    # bench.ui is importable on its own, without the CLI that registers its command.
    code = "import sys, magnitude_tui.bench.ui; assert 'magnitude_tui.bench.cli' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for path in (ROOT / "magnitude_tui/bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("magnitude_tui"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports private names {private} from {node.module}"
            if isinstance(node, ast.ImportFrom) and node.module == "magnitude_tui.bench.cli":
                assert path.name == "cli.py", f"{path.name} imports the CLI (a cycle)"
