"""The app on a remote engine (scripted OpenAI-compatible servers, no model): a pane says which
server it runs on and that it waits for the first token, and the scheduler panel becomes a
servers panel that marks a dead server and shows no local step figures."""

from __future__ import annotations

from magnitude_tui.widgets.status_line import StatusLine
from scheduler.types import Phase
from tests.app_support import remote_app, wait_for
from tests.openai_stub import Script, StubServer
from tests.test_remote_client import free_port_url


def host(url: str) -> str:
    return url.removeprefix("http://")


async def test_a_remote_pane_shows_its_server_and_the_panel_shows_the_servers(tmp_path):
    dead = free_port_url()
    with StubServer(Script(words=12, delay_s=0.02, first_delay_s=0.6)) as stub:
        async with remote_app(tmp_path, dead, stub.url) as (app, pilot):
            ws = app.workspace
            pane = ws.grid.panes[0]
            await pilot.press(*"Say hi.", "enter")

            # Sent, no token yet: the pane says so, and where, instead of a prefill fraction.
            await wait_for(pilot, lambda: pane.replies.last_update is not None
                           and pane.replies.last_update.phase is Phase.WAITING,
                           what="the request to be sent")
            status = pane.query_one(StatusLine)
            await wait_for(pilot, lambda: "waiting for first token" in str(status.query_one(".metrics").content),
                           what="the waiting status")
            assert f"on {stub.url}" in str(status.query_one(".metrics").content)
            assert not status.query_one("ProgressBar").display

            await wait_for(pilot, lambda: pane.replies.last_update.phase is Phase.DONE, what="the reply")
            assert pane.replies.last_update.error is None and pane.replies.last_update.remote.endpoint == stub.url
            # However narrow the status line, the pane's border names its server.
            await wait_for(pilot, lambda: host(stub.url) in str(pane.border_subtitle), what="the server in the border")

            panel = ws.scheduler_panel
            await wait_for(pilot, lambda: panel.endpoints is not None and any(
                e.url == stub.url and e.ttft_p50_ms for e in panel.endpoints.endpoints), what="the servers panel")
            text = panel.render().plain
            assert panel.border_title == "servers"
            assert host(dead) in text and "dead: not reachable" in text
            assert host(stub.url) in text and "0/4 in flight · 0 queued" in text
            ttft = next(e.ttft_p50_ms for e in panel.endpoints.endpoints if e.url == stub.url)
            assert ttft >= 600 and "TTFT p50 —" not in text.split(host(stub.url))[1]
            # No local step figures: the client has none.
            for local in ("policy", "budget", "KV", "step", "prefill"):
                assert local not in text, local


async def test_remote_subagents_send_the_parents_conversation_and_show_the_servers_cache(tmp_path):
    with StubServer(Script(words=4, cached_tokens=7)) as one, StubServer(Script(words=4, cached_tokens=7)) as two:
        async with remote_app(tmp_path, one.url, two.url) as (app, pilot):
            ws = app.workspace
            parent = ws.grid.panes[0]
            await pilot.press(*"plan a trip", "enter")
            await wait_for(pilot, lambda: parent.replies.last_update is not None
                           and parent.replies.last_update.phase is Phase.DONE,
                           what="the parent's reply")
            await pilot.press(*"/spawn 2 list one risk", "enter")
            await wait_for(pilot, lambda: len(ws.grid.panes) == 3 and all(
                c.replies.last_update is not None and c.replies.last_update.phase is Phase.DONE
                for c in ws.grid.panes[1:]),
                what="two subagents' replies")
            bodies = [r["body"] for r in one.requests + two.requests][1:]
            parent_turn = [{"role": m.role, "content": m.content} for m in parent.conversation()[:2]]
            assert len(bodies) == 2
            for body in bodies:  # the parent's conversation, then the task: the server's cache reuses it
                assert body["messages"][:2] == parent_turn and "list one risk" in body["messages"][-1]["content"]
            for child in ws.grid.panes[1:]:
                assert child.replies.last_update.cached_tokens == 7
                # The status line shows it from the next paint after the update (not at once).
                await wait_for(pilot, lambda c=child: "(7 cached)" in str(
                    c.query_one(StatusLine).query_one(".metrics").content), what="the server's cached tokens shown")
            # New conversations go to the least-loaded server: the two subagents do not share one.
            assert {c.replies.last_update.remote.endpoint for c in ws.grid.panes[1:]} == {one.url, two.url}
