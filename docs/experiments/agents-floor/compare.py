"""Pair `serve` with a copy of itself whose engine worker sees extra environment variables.

Used with a temporary switch in `scheduler/budget.py` (`switch.diff`; not in the code), both
sides replay the agent trace at once on a core each (`bench agents --paired`); the copy is the
`serve+fa-on` side, which runs the attention path the probe picks for `serve` on this machine
(flash). Usage, from the repository root with the switch applied:

    .venv/bin/python docs/experiments/agents-floor/compare.py bursts 3 out.json EXP_FLOOR_ROWS=2048
"""

import json
import os
import sys
from contextlib import contextmanager

import magnitude_bench.agents as agents
from magnitude_bench.agents import AgentsConfig, run_agents

inner = agents.open_side


def variant_sides(variant: dict[str, str]):
    @contextmanager
    def open_side(spec, setup):
        if spec.flash_attn != "on":  # the base side
            with inner(spec, setup) as side:
                yield side
            return
        os.environ.update(variant)  # the worker process starts with them
        try:
            cm = inner(spec, setup)
            side = cm.__enter__()
        finally:
            for k in variant:
                os.environ.pop(k, None)
        try:
            yield side
        finally:
            cm.__exit__(None, None, None)

    return open_side


def main(trace: str, reps: int, out: str, *pairs: str) -> None:
    variant = dict(a.split("=", 1) for a in pairs)
    sides = tuple(variant.pop("SIDES", "serve,serve+fa-on").split(","))
    agents.open_side = variant_sides(variant)
    if trace == "bursts":
        cfg = AgentsConfig(bursts=(True,), agents=4, turns=2, k_max=300, think_scale=0.5, reps=reps,
                           exact_replies=True, sides=sides, paired=True)
    else:
        cfg = AgentsConfig(bursts=(False,), agents=2, turns=2, k_max=3000, think_scale=0.5, reps=reps,
                           exact_replies=True, sides=sides, paired=True)
    res = run_agents(cfg, progress=print, argv=["compare"])
    runs = res.data["runs"]
    with open(out, "w") as f:
        json.dump(res.data, f)
    for rep in range(1, reps + 1):
        a, b = [r for r in runs if r["rep"] == rep]
        print(rep, a["side"], a["makespan_s"], b["side"], b["makespan_s"], "variant/base",
              round(b["makespan_s"] / a["makespan_s"], 3))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
