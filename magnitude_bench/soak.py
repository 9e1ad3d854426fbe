"""Provides `bench soak`: the reliability scenarios run long, with a table of what broke and what leaked
(each row: operations or duration, failures, leaked KV cells/slots, data lost).

docs/RELIABILITY.md describes each scenario; they live beside what they test: the engine's state machine
(fake backend and real model), bad inputs and a flood (magnitude_tui/reliability/engine.py); worker kill -9,
damaged databases and model files (reliability/crash.py); the app killed while 8 panes stream
(reliability/app.py); `serve` under faults (reliability/serve.py); CPU contention and UI endurance, timed
against their targets (soak_perf.py).
"""

from __future__ import annotations

from dataclasses import asdict

from magnitude_bench.common import BenchResult
from magnitude_bench.harness import recorded
from magnitude_bench.soak_perf import contention, ui_endurance, ui_long_session
from magnitude_tui.reliability.app import app_kill
from magnitude_tui.reliability.config import Scenario, SoakConfig
from magnitude_tui.reliability.crash import databases, kill_loop, model_files
from magnitude_tui.reliability.engine import bad_inputs, flood, machine_fake, machine_real
from magnitude_tui.reliability.serve import serve_faults

SCENARIOS: dict[str, Scenario] = {
    "machine-fake": machine_fake,
    "machine-real": machine_real,
    "bad-inputs": bad_inputs,
    "flood": flood,
    "kill": kill_loop,
    "databases": databases,
    "model-files": model_files,
    "app-kill": app_kill,
    "contention": contention,
    "ui-endurance": ui_endurance,
    "ui-long-session": ui_long_session,
    "serve-faults": serve_faults,
}


@recorded
def run_soak(cfg: SoakConfig, scenarios: tuple[str, ...], progress=lambda s: None) -> BenchResult:
    rows, failures = [], {}
    for name in scenarios:
        progress(f"soak: {name}")
        row, fails = SCENARIOS[name](cfg, progress)
        rows.append(row)
        if fails:
            failures[name] = fails[:20]
    notes = ["failures: scenarios whose promise broke (an invariant violation, a request that did not "
             "end right, a file not moved aside intact); leaked cells/slots: KV cells and sequence slots "
             "still held after every conversation was closed; data lost: tokens generated but not shown "
             "(or shown twice), requests left without their error, damaged files not kept."]
    for name, fails in failures.items():
        notes += [f"{name}: {f}" for f in fails[:5]]
    # One table: every row gets every column (a scenario's own columns are blank elsewhere).
    columns = list(dict.fromkeys(k for r in rows for k in r))
    simple = [{k: (str(r[k]) if isinstance(r.get(k), dict) else r.get(k)) for k in columns} for r in rows]
    return BenchResult(name="soak", title="Reliability soak", config=asdict(cfg),
                       tables={"scenarios": simple}, notes=notes, data={"failures": failures})
