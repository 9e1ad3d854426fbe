"""Provides the agent-pane tests' engine: ToolClient, a ScriptedClient whose replies may be tool calls, and helpers to run the app on it (agent_app, drive, tool_results)."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Callable

from magnitude_tui.app import MagnitudeApp
from magnitude_tui.engine.events import StepReport
from magnitude_tui.screens.approval_dialog import ApprovalDialog
from magnitude_tui.store import Store
from scheduler.types import DoneReason, Phase, Request, ToolCallDelta
from tests.app_support import SIZE, ScriptedClient, wait_for

# A scripted reply: text, or tool calls as (name, arguments) pairs.
Script = Callable[[Request], "str | list[tuple[str, dict]]"]


def tool_results(request: Request) -> list[str]:
    """The tool messages the request carries (what earlier calls answered), oldest first."""
    return [m.content for m in request.messages if m.role == "tool"]


class ToolClient(ScriptedClient):
    """Each request's reply is `script(request)`: a text, or tool calls delivered with its done
    update (as the engine's parser reports them)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: dict[str, list[tuple[str, dict]]] = {}
        super().__init__(reply=self._reply)

    def _reply(self, request: Request) -> str:
        out = self.script(request)
        if isinstance(out, str):
            return out
        self.calls[request.request_id] = out
        return ""

    def _emit(self, batch: list[object]) -> None:
        for event in batch:
            if not isinstance(event, StepReport):
                continue
            for u in event.updates:
                calls = self.calls.get(u.request_id)
                if calls and u.phase is Phase.DONE and u.done_reason is DoneReason.STOP:
                    u.tool_calls = tuple(ToolCallDelta(i, f"call_{u.request_id}_{i}", name, json.dumps(args))
                                         for i, (name, args) in enumerate(calls))
        super()._emit(batch)


@asynccontextmanager
async def agent_app(tmp_path: Path, client: ToolClient, *, roles=None, resume: bool = False):
    """The app on `client` with tmp_path/work as the agents' workspace root (`resume`: reopening
    the last session's panes from tmp_path's store); yields (app, pilot)."""
    app = MagnitudeApp(client=client, store=Store(tmp_path / "magnitude.db"), export_dir=tmp_path / "exports",
                       roles=roles, workdir=tmp_path / "work", resume=resume)
    async with app.run_test(size=SIZE) as pilot:
        yield app, pilot


async def drive(pilot, client: ScriptedClient, condition, what: str, on_dialog=None) -> None:
    """Step the scripted engine and let the app run until condition() holds. `on_dialog`: called
    (and the dialog allowed once) whenever an approval dialog shows up meanwhile."""
    def step_until() -> bool:
        if condition():
            return True
        if on_dialog is not None and isinstance(pilot.app.screen, ApprovalDialog):
            on_dialog()
            pilot.app.screen.action_allow_once()
        if client.live:
            client.step()
        return False

    await wait_for(pilot, step_until, what=what)
