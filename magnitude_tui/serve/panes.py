"""Provides ApiPanes: in `magnitude-tui --serve PORT`, every HTTP caller's requests appear as a pane."""

from __future__ import annotations

import asyncio

from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.store import MessageRecord, PaneRecord
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.pane_grid import MAX_PANES
from scheduler.types import Request


class ApiPanes:
    """Opens a pane per HTTP conversation (titled by the request's `user`, else the caller's
    address) and starts each request in it, so its phase, TTFT, tok/s and ITL show like any pane's;
    closing the pane cancels the request. A caller's next request continues in the same pane."""

    def __init__(self, hub: EngineHub, workspace) -> None:
        self.hub = hub
        self.workspace = workspace  # needs: panes_by_session(), open_pane(pane), grid
        hub.on_request = self.on_request
        self._tasks: set[asyncio.Task] = set()

    def on_request(self, request: Request, client_name: str) -> None:
        ws = self.workspace
        # Every pane opened so far, mounted or not: the grid lists a pane only once it is mounted,
        # after this call returns, so the n choices of one call would all take the same title.
        panes = ws.panes_by_session()
        pane = panes.get(request.session_id)
        incoming = [MessageRecord(m.role, m.content) for m in request.messages]
        if pane is None:
            if len(panes) >= MAX_PANES:
                return  # the grid is full: the request runs without a pane
            taken = {p.record.name for p in panes.values()}
            name, k = client_name, 1
            while name in taken:  # the same caller with several conversations at once, or n > 1
                k += 1
                name = f"{client_name}#{k}"
            record = PaneRecord(request.session_id, name, "api", None, client_name, len(ws.grid.panes), incoming)
            pane = ChatPane(record)
            self._track(ws.open_pane(pane))
        else:
            shown = [(m.role, m.content) for m in pane.record.messages]
            known = 0
            while known < min(len(shown), len(incoming)) and shown[known] == (incoming[known].role,
                                                                               incoming[known].content):
                known += 1
            for message in incoming[known:]:
                self._track(asyncio.ensure_future(pane.add_message(message)))
        pane.begin_request(request.request_id)

    def _track(self, task: asyncio.Future) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
