"""Provides what every `bench soak` scenario shares: its config, its row of the table and its
signature (a scenario module imports this, never `soak.py`, so the command imports them without a
circle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class SoakConfig:
    fake_ops: int = 100_000
    real_ops: int = 2_000
    bad_rounds: int = 20
    flood_rounds: int = 5
    kill_rounds: int = 10
    db_rounds: int = 25
    app_kill_rounds: int = 5
    seed: int = 1
    model: str | None = None
    device: str = "cpu"
    contention_reps: int = 2
    ui_flood: int = 100_000
    serve_rounds: int = 3


# A scenario: (config, progress line printer) -> (its row of the table, its failures).
Scenario = Callable[[SoakConfig, Callable[[str], None]], tuple[dict, list[str]]]


def soak_row(scenario: str, amount: str, failures: int, leaked: str, lost: str, **extra) -> dict:
    return {"scenario": scenario, "operations or duration": amount, "failures": failures,
            "leaked cells/slots": leaked, "data lost": lost, **extra}
