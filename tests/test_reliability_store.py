"""A corrupt, foreign or newer database never stops the app silently or loses a file: the schema
version is checked, older files migrate forward, newer ones are refused, unreadable ones move aside."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from magnitude_tui import store_schema
from magnitude_tui.store import MessageRecord, PaneRecord, Store, StoreError

ROOT = Path(__file__).resolve().parents[1]


def _filled(path: Path, n_messages: int = 1) -> None:
    store = Store(path)
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1"))
    for i in range(n_messages):
        store.add_message("p1", MessageRecord("user", f"message {i} " + "x" * 200))
    store.close()


def _moved(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.iterdir() if ".unreadable-" in p.name)


def test_random_bytes_are_moved_aside_and_a_fresh_store_starts(tmp_path):
    path = tmp_path / "m.db"
    junk = os.urandom(8192)
    path.write_bytes(junk)
    store = Store(path)
    [moved] = _moved(path)
    assert moved.read_bytes() == junk  # never deleted, never changed
    assert str(moved) in store.notice and "could not be read" in store.notice
    assert store.open_workspace(resume=True) == []
    store.add_pane(PaneRecord("p", "A1"))
    store.close()
    assert Store(path).notice is None  # the new file is healthy


def test_a_damaged_second_half_is_found_at_open_not_at_resume(tmp_path):
    path = tmp_path / "m.db"
    _filled(path, n_messages=400)
    data = bytearray(path.read_bytes())
    half = len(data) // 2
    data[half:] = os.urandom(len(data) - half)
    path.write_bytes(bytes(data))
    store = Store(path)
    [moved] = _moved(path)
    assert moved.read_bytes() == bytes(data)
    assert "could not be read" in store.notice
    assert store.open_workspace(resume=True) == []


def test_the_wal_companion_moves_with_its_database(tmp_path):
    path = tmp_path / "m.db"
    path.write_bytes(os.urandom(4096))
    wal = tmp_path / "m.db-wal"
    wal.write_bytes(b"stale log")
    Store(path).close()
    main, log = _moved(path)  # sorted: the database, then its -wal
    assert log.name == main.name + "-wal" and log.read_bytes() == b"stale log"


def test_a_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "m.db"
    _filled(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=7")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="schema version 7.*newer magnitude-tui"):
        Store(path)
    assert path.read_bytes() == before and not _moved(path)


def test_a_database_of_another_program_is_moved_aside_not_rewritten(tmp_path):
    path = tmp_path / "m.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE recipes (name TEXT)")
    db.execute("INSERT INTO recipes VALUES ('soup')")
    db.commit()
    db.close()
    before = path.read_bytes()
    store = Store(path)
    [moved] = _moved(path)
    assert "another program" in store.notice
    assert moved.read_bytes() == before  # not even its header was touched
    assert sqlite3.connect(moved).execute("SELECT name FROM recipes").fetchall() == [("soup",)]


def test_a_file_stamped_with_our_version_but_another_layout_is_moved_aside(tmp_path):
    path = tmp_path / "m.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, text TEXT)")
    db.execute(f"PRAGMA user_version={store_schema.SCHEMA_VERSION}")
    db.commit()
    db.close()
    before = path.read_bytes()
    store = Store(path)
    [moved] = _moved(path)
    assert "stamped schema 1 but" in store.notice and moved.read_bytes() == before
    assert store.open_workspace(resume=True) == []
    store.add_pane(PaneRecord("p", "A1", messages=[MessageRecord("user", "hi")]))  # no "no such column"


def test_an_older_schema_migrates_forward_and_keeps_its_data(tmp_path, monkeypatch):
    path = tmp_path / "m.db"
    _filled(path, n_messages=3)

    def add_updated(db):
        db.execute("ALTER TABLE messages ADD COLUMN updated REAL")

    # As if this version had schema 2, which adds a column, and knew how to get there from 1.
    monkeypatch.setattr(store_schema, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(store_schema.MIGRATIONS, 1, add_updated)
    monkeypatch.setitem(store_schema.COLUMNS, "messages", store_schema.COLUMNS["messages"] | {"updated"})
    store = Store(path)
    assert store.migrated_from == 1 and store.notice is None
    [pane] = store.open_workspace(resume=True)
    assert [m.content[:9] for m in pane.messages] == ["message 0", "message 1", "message 2"]
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (2,)
    assert "updated" in {r[1] for r in db.execute("PRAGMA table_info(messages)")}


def test_the_app_refuses_a_newer_database_with_a_message_not_a_traceback(tmp_path):
    data_home = tmp_path / "data"
    path = data_home / "magnitude-tui" / "magnitude.db"
    path.parent.mkdir(parents=True)
    _filled(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=9")
    db.close()
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    r = subprocess.run([sys.executable, "-m", "magnitude_tui.cli"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "newer magnitude-tui" in r.stderr and "Traceback" not in r.stderr


# ---- read-only files and directories -----------------------------------------------------------

class _ReadOnly:
    """Makes a path read-only for the test: chmod, and as root (whom SQLite and chmod do not stop)
    the immutable attribute too. Undone on exit so tmp_path can be cleaned up."""

    def __init__(self, path: Path) -> None:
        self.path, self.mode, self.immutable = path, path.stat().st_mode, False

    def __enter__(self) -> "_ReadOnly":
        self.path.chmod(0o555 if self.path.is_dir() else 0o444)
        if os.geteuid() == 0:
            self.immutable = subprocess.run(["chattr", "+i", str(self.path)], capture_output=True).returncode == 0
        if os.access(self.path, os.W_OK):
            self.__exit__()
            pytest.fail(f"could not make {self.path} read-only here (root without chattr +i); "
                        "run this test as a normal user")
        return self

    def __exit__(self, *exc) -> None:
        if self.immutable:
            subprocess.run(["chattr", "-i", str(self.path)], check=True)
        self.path.chmod(self.mode)


def test_a_read_only_database_opens_in_memory_says_why_and_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "m.db"
    _filled(path, n_messages=3)
    before = path.read_bytes()
    with _ReadOnly(path):
        store = Store(path)
        assert store.read_only and "read-only" in store.read_only
        assert "History will not be saved" in store.notice and str(path) in store.notice
        [pane] = store.open_workspace(resume=True)  # the history is there to see...
        assert [m.content[:9] for m in pane.messages] == ["message 0", "message 1", "message 2"]
        store.add_message(pane.id, MessageRecord("user", "new"))  # ...and the session goes on
        assert store.messages(pane.id)[-1].content == "new"
        store.close()
        assert path.read_bytes() == before
    assert not _moved(path)


def test_a_read_only_directory_without_a_database_starts_an_empty_store_in_memory(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    with _ReadOnly(folder):
        store = Store(folder / "m.db")
        assert store.read_only and str(folder) in store.read_only
        assert store.open_workspace(resume=True) == []
        store.add_pane(PaneRecord("p", "A1"))
        store.close()
    assert list(folder.iterdir()) == []


def test_a_corrupt_read_only_database_is_left_alone_and_an_empty_store_starts(tmp_path):
    path = tmp_path / "m.db"
    junk = os.urandom(4096)
    path.write_bytes(junk)
    with _ReadOnly(path):
        store = Store(path)
        assert "could not be read either" in store.read_only
        assert store.open_workspace(resume=True) == []
        store.close()
    assert path.read_bytes() == junk and not _moved(path)


async def test_the_app_starts_on_a_read_only_database_says_so_and_carries_on(tmp_path):
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.widgets.composer import Composer
    from tests.app_support import ScriptedClient, settle, wait_for

    path = tmp_path / "m.db"
    _filled(path, n_messages=2)
    before = path.read_bytes()
    with _ReadOnly(path):
        client = ScriptedClient()
        app = MagnitudeApp(client=client, store=Store(path), resume=True, export_dir=tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
            notes = [n.message for n in app._notifications]
            assert any("History will not be saved" in n and "read-only" in n for n in notes), notes
            [pane] = app.workspace.grid.panes
            assert len(pane.record.messages) == 2  # the saved history is shown
            pane.query_one(Composer).focus()
            await pilot.press(*"hello", "enter")
            await wait_for(pilot, lambda: pane.busy, what="the reply to start")
            client.run_to_completion()
            await settle(pilot)
            assert pane.record.messages[-1].complete and "hello" in pane.record.messages[-1].content
        assert path.read_bytes() == before
