"""`generate` with nothing to run: a usage error before any model is loaded."""

from __future__ import annotations

from typing import cast

from magnitude_tui.engine.protocol import EngineClient
from magnitude_tui.generate import run_generate


class _Untouchable:
    def start(self) -> None:
        raise AssertionError("the engine was started for no prompts")

    def stop(self) -> None:
        raise AssertionError("the engine was stopped for no prompts")


def test_no_prompts_is_a_usage_error_and_loads_nothing(capsys):
    code = run_generate([], cast(EngineClient, _Untouchable()), max_tokens=4, temperature=0.0, seed=None, stream=False, json_out=True)
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no empty JSON document or table as if it had run
    assert "no prompts" in captured.err
