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


def test_a_panes_role_tools_approve_and_tool_choice_are_kept(tmp_path):
    from magnitude_tui.agent.policy import ApprovePolicy
    from magnitude_tui.agents import AgentSettings
    from scheduler.types import ToolChoiceMode

    store = Store(tmp_path / "m.db")
    store.open_workspace(resume=False)
    pane = PaneRecord("p1", "A1")
    store.add_pane(pane)
    reader = AgentSettings("reader", "You read.", 0.2, tools=("read_file", "search"), approve=ApprovePolicy.READ_ONLY,
                           tool_choice=ToolChoiceMode.REQUIRED)
    store.set_pane_settings(pane.id, reader)
    no_tools = AgentSettings("quiet", "", tools=())
    other = PaneRecord("p2", "A2")
    store.add_pane(other)
    store.set_pane_settings(other.id, no_tools)
    store.close()
    again = Store(tmp_path / "m.db")
    assert again.pane_settings(pane.id) == reader
    assert again.pane_settings(other.id).tools == ()  # no tools is not every tool


def test_a_database_from_before_the_tool_columns_gains_them_and_reads_the_defaults(tmp_path):
    path = tmp_path / "m.db"
    store = Store(path)
    store.open_workspace(resume=False)
    pane = PaneRecord("p1", "A1")
    store.add_pane(pane)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE pane_settings")
    db.execute("CREATE TABLE pane_settings (pane_id TEXT PRIMARY KEY REFERENCES panes(id), role TEXT, "
               "system TEXT NOT NULL, temperature REAL, max_tokens INTEGER, top_p REAL, min_p REAL)")
    db.execute("INSERT INTO pane_settings VALUES (?, 'reader', 'old', NULL, NULL, NULL, NULL)", (pane.id,))
    db.commit()
    db.close()
    settings = Store(path).pane_settings(pane.id)
    assert (settings.role, settings.system, settings.tools, settings.approve) == ("reader", "old", None, None)


def test_a_full_disk_mid_session_goes_on_in_memory_and_says_so_once(tmp_path):
    # sqlite3.OperationalError 'database or disk is full' raised into the app, which quit and lost
    # the message being saved.
    store = Store(tmp_path / "m.db")
    told: list[str] = []
    store.on_notice = told.append
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
    store.set_queued("p1", ["queued " + "x" * 5000, "another"])  # a transaction, cut mid-way
    reply = MessageRecord("assistant", "y" * 20000)
    store.add_message("p1", reply)
    reply.content += " and more"
    store.save_messages([reply])
    assert store.read_only and "disk is full" in store.read_only
    assert len(told) == 1 and "no longer saved" in told[0]
    assert store.queued("p1") == ["queued " + "x" * 5000, "another"]  # the whole transaction, once
    assert [m.content for m in store.messages("p1")] == ["hi", "y" * 20000 + " and more"]
    store.close()
    kept = Store(tmp_path / "m.db")  # what was saved before the disk filled is still there
    assert [m.content for m in kept.messages("p1")] == ["hi"]


def test_when_the_file_cannot_even_be_read_the_session_goes_on_in_an_empty_store(tmp_path):
    store = Store(tmp_path / "m.db")
    told: list[str] = []
    store.on_notice = told.append
    store.open_workspace(resume=False)
    real = store._db.db

    class Broken:  # every statement fails as an I/O error would, and so does reading the file back
        in_transaction = False

        def execute(self, *a):
            raise sqlite3.OperationalError("disk I/O error")

        def backup(self, target):
            raise sqlite3.OperationalError("disk I/O error")

        def close(self):
            real.close()

    store._db.db = Broken()  # type: ignore[assignment]
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    assert [m.content for m in store.messages("p1")] == ["hi"] and len(told) == 1
