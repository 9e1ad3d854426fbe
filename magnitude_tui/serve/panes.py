"""Provides ApiPanes: in `magnitude-tui --serve PORT`, every HTTP caller's requests appear as a pane."""

from __future__ import annotations

import asyncio

from magnitude_tui.engine.protocol import timed_updates
from magnitude_tui.names import first_free, numbered
from magnitude_tui.records import MessageRecord, PaneRecord
from magnitude_tui.serve.hub import EngineHub
from magnitude_tui.widgets.chat_pane import ChatPane
from magnitude_tui.widgets.pane_grid import MAX_PANES
from scheduler.types import Phase, Request


class ApiPanes:
    """Opens a pane per HTTP conversation (titled by the request's `user`, else the caller's
    address) and starts each request in it, so its phase, TTFT, tok/s and ITL show like any pane's;
    closing the pane cancels the request. A caller's next request continues in the same pane.
    Once the grid is full, a conversation still gets its row in the sequences panel."""

    def __init__(self, hub: EngineHub, workspace) -> None:
        self.hub = hub
        self.workspace = workspace  # needs: panes_by_session(), open_pane(pane), sequences_panel
        hub.on_request = self.on_request
        self._tasks: set[asyncio.Future] = set()
        self._unpaned: dict[str, str] = {}  # session -> caller name, while its request runs

    def on_request(self, request: Request, client_name: str) -> None:
        ws = self.workspace
        # Every pane opened so far, mounted or not: the grid lists a pane only once it is mounted,
        # after this call returns, so the n choices of one call would all take the same title.
        panes = ws.panes_by_session()
        pane = panes.get(request.session_id)
        incoming = MessageRecord.from_messages(request.messages)  # a tool result shows as its call's block
        if pane is None:
            if len(panes) >= MAX_PANES:
                self._unpaned[request.session_id] = client_name  # the grid is full: a row only
                return
            taken = {p.record.name for p in panes.values()}
            # The same caller with several conversations at once, or n > 1: "name#2", ...
            name = first_free(taken, numbered(client_name, "#"))
            record = PaneRecord(request.session_id, name, "api", None, client_name, len(panes), incoming)
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

    def show_unpaned(self, batch: list) -> None:
        """List the requests that have no pane in the sequences panel (the workspace lists only the
        sessions of its panes), until each ends."""
        if not self._unpaned:
            return
        for update, t in timed_updates(batch):
            name = self._unpaned.get(update.session_id)
            if name is None:
                continue
            self.workspace.sequences_panel.apply(update, name, t)
            if update.phase is Phase.DONE:
                del self._unpaned[update.session_id]

    def _track(self, task: asyncio.Future) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
