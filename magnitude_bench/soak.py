"""Provides `bench soak`: the reliability scenarios run long, with a table of what broke and what leaked.

Scenarios (each row: operations or duration, failures, leaked KV cells/slots, data lost):
In this process (magnitude_tui/reliability/engine.py):
- state machine, fake backend: a seeded random walk of submit / follow-up / fork / cancel / close /
  policy / "no KV slot" / step, the engine's accounting checked after every step (EngineHarness);
- state machine, real model: the same walk on SmolLM2 (no injected KV faults: the real cache fills);
- bad inputs: every malformed request of the catalogue beside a good one, repeatedly;
- flood: 64 requests at once, admitted first come first served, queue time reported.
Outside the engine (reliability/crash.py):
- worker kill -9: three streaming requests (every other round plus a reused id), SIGKILL, every one
  must end with an error within 1 s, then a restart must serve a new request;
- corrupt databases: random bytes, a damaged half, a truncation, another program's file, a newer
  schema: the store must move the file aside intact (or refuse a newer one) and start;
- corrupt model files: each handed to a real engine worker, which must fail with a reason.
And:
- app kill -9 while 8 panes stream (reliability/app.py): at most 1 s of received text lost on resume;
- CPU contention and UI endurance (soak_perf.py): figures against their targets.
- serve under faults (reliability/serve.py): a real `serve` under an idle-connection flood, hostile
  headers, a worker kill -9 and SIGTERM; every stream must end with a finish reason or an error,
  then [DONE].
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
