"""The store under faults a user meets: a disk already full at start, text SQLite cannot hold (lone
surrogates), bytes in the file that are not UTF-8, a damaged schema whose name is not UTF-8. Each
raised into the app (a traceback at start, or the app quitting mid-session); each now goes on and
keeps every file it could not read."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from magnitude_tui import store_open
from magnitude_tui.export import pane_markdown
from magnitude_tui.store import MessageRecord, PaneRecord, Store
from magnitude_tui.store_schema import SCHEMA
from tests.app_support import ScriptedClient, make_app, one_turn, settle, wait_for


def _filled(path: Path, *texts: str) -> None:
    store = Store(path)
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1"))
    for text in texts:
        store.add_message("p1", MessageRecord("user", text))
    store.close()
    db = sqlite3.connect(path)  # everything into the main file, so its bytes can be edited
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


def test_a_lock_file_on_a_full_disk_does_not_stop_the_store(tmp_path):
    assert os.path.exists("/dev/full"), "this test writes to Linux's /dev/full"
    # Writing the pid into <db>.lock raised OSError ENOSPC out of Store(): a traceback at start.
    # /dev/full takes the lock and fails every write, as a full disk does.
    (tmp_path / "m.db.lock").symlink_to("/dev/full")
    store = Store(tmp_path / "m.db")
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    store.close()
    assert [m.content for m in Store(tmp_path / "m.db").messages("p1")] == ["hi"]


def test_a_store_the_full_disk_cannot_take_at_start_runs_in_memory_and_says_to_free_room(tmp_path, monkeypatch):
    # Creating the schema failed with "database or disk is full" and the app refused to start,
    # telling the user to close another magnitude-tui and check permissions.
    hold = store_open._Connection.hold_instance_lock

    def full_disk(self, path):
        hold(self, path)
        self.execute("PRAGMA max_page_count = 1")  # SQLite's own SQLITE_FULL from the next page on

    monkeypatch.setattr(store_open._Connection, "hold_instance_lock", full_disk)
    store = Store(tmp_path / "m.db")
    assert store.read_only and "disk is full" in store.read_only
    assert store.notice and "free some room" in store.notice and "writable" not in store.notice
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    assert [m.content for m in store.messages("p1")] == ["hi"]
    assert not [p for p in tmp_path.iterdir() if ".unreadable-" in p.name]  # nothing was moved aside


def test_lone_surrogates_are_saved_as_replacement_characters_and_the_rest_byte_for_byte(tmp_path):
    # A remote server's "\ud800" escape streamed a lone surrogate into a reply; saving it raised
    # UnicodeEncodeError into the app, which quit (the reply since the last save was lost).
    store = Store(tmp_path / "m.db")
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1"))
    big = "é\x00\r\n" * 300_000  # a 1.5 MB paste with NUL bytes and CRLFs: kept exactly
    store.add_message("p1", MessageRecord("user", big))
    reply = MessageRecord("assistant", "a \ud800 b", complete=False)
    store.add_message("p1", reply)
    reply.content += " \udcff c"
    store.save_messages([reply])
    store.set_queued("p1", ["q \udfff", "next"])  # inside a transaction
    store.rename_pane("p1", "A\ud83d1")
    assert store.read_only is None  # still saving
    store.close()
    again = Store(tmp_path / "m.db")
    [pane] = again.open_workspace(resume=True)
    assert [m.content for m in pane.messages] == [big, "a \ufffd b \ufffd c"]
    assert pane.queued == ["q \ufffd", "next"] and pane.name == "A\ufffd1"


def test_text_in_the_file_that_is_not_utf8_reads_as_replacement_characters(tmp_path):
    # A flipped bit (or another program's write) in one message made Python's sqlite3 raise
    # UnicodeDecodeError at resume: the app could not start on any of the store's conversations.
    path = tmp_path / "m.db"
    _filled(path, "hello", "second")
    db = sqlite3.connect(path)
    db.execute("UPDATE messages SET content = CAST(X'61ff62' AS TEXT) WHERE content = 'hello'")
    db.commit()
    db.close()
    store = Store(path)
    assert store.notice is None
    [pane] = store.open_workspace(resume=True)
    assert [m.content for m in pane.messages] == ["a\ufffdb", "second"]
    assert store.conversations()[0].preview == "a\ufffdb"


def test_a_damaged_schema_name_that_is_not_utf8_is_moved_aside_intact(tmp_path):
    # SQLite's "malformed database schema (sqlite_autoindex\xa0...)" came as UnicodeDecodeError,
    # not DatabaseError, past every handler: a traceback at start instead of moving the file aside.
    path = tmp_path / "m.db"
    _filled(path, "hello")
    name = b"sqlite_autoindex_pane_settings_1"
    damaged = path.read_bytes().replace(name, b"sqlite_autoindex\xa0pane_settings_1")
    path.write_bytes(damaged)
    store = Store(path)
    assert store.moved_to is not None and store.moved_to.read_bytes() == damaged
    assert store.notice and "malformed database schema" in store.notice
    assert store.open_workspace(resume=True) == []


def test_a_damaged_schema_name_in_a_read_only_place_is_left_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "m.db"
    _filled(path, "hello")
    damaged = path.read_bytes().replace(b"sqlite_autoindex_pane_settings_1", b"sqlite_autoindex\xa0pane_settings_1")
    path.write_bytes(damaged)
    monkeypatch.setattr(store_open, "read_only_reason", lambda p: f"the directory {p.parent} is read-only")
    store = Store(path)
    assert store.read_only and "could not be read either" in store.read_only
    assert path.read_bytes() == damaged and store.moved_to is None


async def test_a_reply_with_a_lone_surrogate_is_kept_exported_and_the_app_goes_on(tmp_path):
    client = ScriptedClient(reply=lambda request: "bad \ud800 byte, then more")
    app = make_app(tmp_path, client)
    async with app.run_test(notifications=True) as pilot:
        await one_turn(pilot, client, "hi")
        [pane] = app.workspace.grid.panes
        assert "\ud800" in pane_markdown(pane)  # what the pane holds, as the engine sent it
        await pilot.press("f5")
        await wait_for(pilot, lambda: list((tmp_path / "exports").glob("*.md")), what="the export")
        [exported] = (tmp_path / "exports").glob("*.md")
        assert "bad \ufffd byte, then more" in exported.read_text(encoding="utf-8")
        await one_turn(pilot, client, "again")  # still running, still saving
        await settle(pilot)
        assert app.workspace.store.read_only is None
    saved = Store(tmp_path / "magnitude.db").messages(pane.session_id)
    assert [m.content for m in saved] == ["hi", "bad \ufffd byte, then more", "again", "bad \ufffd byte, then more"]


def _wal_only(path: Path) -> bytes:
    """A store whose conversation is only in its -wal (as a kill leaves it), the -wal's bytes."""
    store = Store(path)
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1"))
    for i in range(3):
        store.add_message("p1", MessageRecord("user", f"precious {i}"))
    wal = path.with_name(path.name + "-wal").read_bytes()  # before close checkpoints it
    store.close()
    assert wal
    return wal


@pytest.mark.parametrize("main_file", ["empty", "missing"])
def test_a_wal_beside_an_empty_or_missing_database_is_kept_and_its_conversations_recovered(tmp_path, main_file):
    # SQLite deleted it as stale, silently, and every conversation in it with it.
    path = tmp_path / "m.db"
    wal = _wal_only(path)
    path.unlink()
    if main_file == "empty":
        path.write_bytes(b"")
    path.with_name("m.db-wal").write_bytes(wal)
    store = Store(path)
    assert store.notice and "write-ahead log" in store.notice
    kept = [p for p in tmp_path.iterdir() if p.name.endswith("-wal") and ".unreadable-" in p.name]
    assert [p.read_bytes() for p in kept] == [wal]
    assert str(store.moved_to) in store.notice and store.moved_to.exists()
    assert "3 messages its log held were recovered" in store.notice
    [pane] = store.open_workspace(resume=True)
    assert [m.content for m in pane.messages] == ["precious 0", "precious 1", "precious 2"]
    store.add_message("p1", MessageRecord("user", "and on"))  # a store like any other
    store.close()
    assert len(Store(path).messages("p1")) == 4


def test_a_wal_that_holds_only_part_of_a_lost_database_is_kept_and_an_empty_store_starts(tmp_path):
    path = tmp_path / "m.db"
    _filled(path, *(f"old {i} " + "x" * 300 for i in range(100)))  # checkpointed into the file
    store = Store(path)
    store.open_workspace(resume=True)
    store.add_message("p1", MessageRecord("user", "new"))
    wal = path.with_name("m.db-wal").read_bytes()  # only the pages this write changed
    store.close()
    path.write_bytes(b"")
    path.with_name("m.db-wal").write_bytes(wal)
    store = Store(path)
    assert store.notice and "new, empty one" in store.notice
    assert store.open_workspace(resume=True) == []
    assert store.moved_to is not None and store.moved_to.with_name(store.moved_to.name + "-wal").read_bytes() == wal


def _garbled_under_it(path: Path, told: list[str]) -> Store:
    """A store of pane A1's 200 messages whose file another program, or the disk, then garbles
    (a page of messages) under it; its notices go to `told`."""
    store = Store(path)
    store.on_notice = told.append
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1"))
    store._db.execute("PRAGMA cache_size = 10")  # read from the file, not from pages cached before
    for i in range(200):
        store.add_message("p1", MessageRecord("user", f"m {i} " + "x" * 1000))
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(path, "r+b") as f:
        f.seek(4096 * 29)
        f.write(bytes(range(256)) * 16)
    return store


def test_a_file_damaged_under_the_running_app_goes_on_in_memory_says_so_and_is_kept(tmp_path):
    # "database disk image is malformed" (a DatabaseError, not OperationalError) raised from the
    # next read or write into the app, which quit and lost the conversation it held.
    path = tmp_path / "m.db"
    told: list[str] = []
    store = _garbled_under_it(path, told)
    damaged = path.read_bytes()
    store.messages("p1")  # read: no exception
    reply = MessageRecord("assistant", "still here", complete=False)
    store.add_message("p1", reply)
    reply.content += ", and more"
    store.save_messages([reply])
    store.conversations()
    assert len(told) == 1 and "damaged" in told[0] and "kept aside" in told[0]
    assert store.read_only and "damaged" in store.read_only
    assert [m.content for m in store.messages("p1")][-1] == "still here, and more"
    store.close()
    assert path.read_bytes() == damaged  # not written, not removed
    again = Store(path)  # the next start keeps it aside
    assert again.moved_to is not None and again.moved_to.read_bytes() == damaged


def test_an_export_the_disk_cannot_take_leaves_no_cut_off_file(tmp_path):
    # The app said "Could not export" and left a file cut off mid-conversation in the folder,
    # named like a whole export. RLIMIT_FSIZE makes writes past 4 KB fail as a full disk does.
    script = f"""
import resource, signal, sys
from types import SimpleNamespace
from pathlib import Path
from magnitude_tui.export import export_pane
from magnitude_tui.store import MessageRecord
from magnitude_tui.agents import AgentSettings
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
record = SimpleNamespace(name="A1", settings=AgentSettings(), messages=[MessageRecord("user", "x" * 100_000)])
pane = SimpleNamespace(title="A1", record=record, queued=[], is_streaming=lambda m: False,
                       is_dropped=lambda m: False)
try:
    export_pane(pane, Path({str(tmp_path / "exports")!r}))
except OSError as e:
    print("refused", e.errno)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.startswith("refused"), out.stderr
    assert list((tmp_path / "exports").iterdir()) == []


def test_a_search_for_like_wildcards_finds_them_as_typed(tmp_path):
    # "%" and "_" are LIKE's wildcards: a search for "_" listed every conversation.
    store = Store(tmp_path / "m.db")
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "a plain file name")]))
    store.add_pane(PaneRecord("p2", "A2", messages=[MessageRecord("user", "hello"),
                                                     MessageRecord("user", "file_name, 100% and C:\\dir")]))
    for needle in ("_", "%", "file_name", "100%", "C:\\dir"):
        assert [r.name for r in store.conversations(needle)] == ["A2"], needle
    assert store.conversations("100%")[0].match == "file_name, 100% and C:\\dir"
    assert {r.name for r in store.conversations("")} == {"A1", "A2"}


def test_another_program_holding_the_database_locked_does_not_stop_the_app(tmp_path):
    # A DB browser with unsaved edits holds a write transaction: the app's next save waited the
    # busy timeout, then "database is locked" raised into the app, which quit.
    path = tmp_path / "m.db"
    store = Store(path)
    told: list[str] = []
    store.on_notice = told.append
    store.open_workspace(resume=False)
    store.add_pane(PaneRecord("p1", "A1", messages=[MessageRecord("user", "hi")]))
    store._db.execute("PRAGMA busy_timeout = 50")  # the app waits 5 s; the test need not
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    store.add_message("p1", MessageRecord("assistant", "hello"))
    assert len(told) == 1 and "another program" in told[0] and "close that program" in told[0]
    assert [m.content for m in store.messages("p1")] == ["hi", "hello"]
    other.execute("ROLLBACK")
    other.close()
    store.close()
    assert [m.content for m in Store(path).messages("p1")] == ["hi"]  # what was saved before it


def test_a_file_damaged_under_the_running_app_keeps_what_still_reads(tmp_path):
    # The copy in memory of a damaged file fails its check, and the session went on with an empty
    # store: no workspace, no panes (the next pane was named A1 again beside the open A1, and f4
    # listed nothing) and none of the messages on pages that still read.
    store = _garbled_under_it(tmp_path / "m.db", [])
    store.messages("p1")
    store.add_message("p1", MessageRecord("assistant", "still here"))
    assert store.read_only and "damaged" in store.read_only
    assert store.pane_names() == ["A1"]
    kept = [m.content for m in store.messages("p1")]
    assert kept[-1] == "still here" and kept[0].startswith("m 0 ")
    assert 20 <= len(kept) < 201  # the pages before the damaged one; not those after it
    assert [(c.id, c.is_open) for c in store.conversations()] == [("p1", True)]
    store.close()


def test_a_wal_rebuilt_into_a_file_that_is_not_a_store_of_ours_gives_an_empty_store(tmp_path):
    # A store killed between writing its schema and stamping its version leaves a log that
    # rebuilds into a sound database without our version: opening the rebuild raised an internal
    # _Unreadable out of Store() (a traceback at start).
    src = tmp_path / "src.db"
    db = sqlite3.connect(src)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    wal = src.with_name("src.db-wal").read_bytes()  # before close checkpoints it
    db.close()
    path = tmp_path / "m.db"
    path.write_bytes(b"")
    path.with_name("m.db-wal").write_bytes(wal)
    store = Store(path)
    assert store.notice and "write-ahead log" in store.notice and "recovered" not in store.notice
    kept = [p for p in tmp_path.iterdir() if p.name.endswith("-wal") and ".unreadable-" in p.name]
    assert [p.read_bytes() for p in kept] == [wal]  # the log stays kept
    assert store.open_workspace(resume=True) == []
    store.add_pane(PaneRecord("p1", "A1"))
    store.add_message("p1", MessageRecord("user", "a fresh start"))
    store.close()
    assert [m.content for m in Store(path).messages("p1")] == ["a fresh start"]
