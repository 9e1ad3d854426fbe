"""The SQLite store on its own: workspaces, stable message ids, settings."""

from __future__ import annotations

import sqlite3

from magnitude_tui.store import MessageRecord, PaneRecord, Store


def test_resume_reopens_the_latest_workspace_and_updates_never_duplicate(tmp_path):
    path = tmp_path / "m.db"
    store = Store(path)
    assert store.open_workspace(resume=True) == []  # nothing to resume: a fresh workspace
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    reply = MessageRecord("assistant", "Hel", complete=False)
    store.add_message("p1", reply)
    reply.content = "Hello"
    store.save_messages([reply])
    reply.content, reply.complete, reply.done_reason = "Hello!", True, "stop"
    store.save_messages([reply])
    store.add_pane(PaneRecord("p2", "A1.1", "subagent", "p1", "task", 1))
    store.close_pane("p2")
    store.close()

    store = Store(path)
    [pane] = store.open_workspace(resume=True)
    assert (pane.id, pane.name) == ("p1", "A1")
    assert [(m.role, m.content, m.complete, m.done_reason) for m in pane.messages] == [
        ("user", "hi", True, None), ("assistant", "Hello!", True, "stop")]
    assert store.pane_names() == ["A1"]  # a closed pane's name is free again
    assert store.open_workspace(resume=False) == []  # a new workspace; the old one is kept
    store.close()
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM messages").fetchone() == (2,)


def test_settings_round_trip(tmp_path):
    store = Store(tmp_path / "m.db")
    assert store.get_setting("theme") is None
    store.set_setting("theme", "magnitude-paper")
    store.set_setting("theme", "magnitude")
    assert store.get_setting("theme") == "magnitude"
