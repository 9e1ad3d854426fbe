"""Provides SoakConfig and soak_row: what every `bench soak` scenario takes and the row it returns
(a module of their own, so the scenario modules need not import the soak that runs them)."""

from __future__ import annotations

from dataclasses import dataclass


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


def soak_row(scenario: str, amount: str, failures: int, leaked: str, lost: str, **extra) -> dict:
    return {"scenario": scenario, "operations or duration": amount, "failures": failures,
            "leaked cells/slots": leaked, "data lost": lost, **extra}
