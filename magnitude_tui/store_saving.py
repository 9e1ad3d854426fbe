"""Provides SavingConnection: the store's SQLite connection, which goes on in memory when the file
can no longer take a write, and Transaction over it."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Callable, Iterator

from magnitude_tui.engine.text import encodable_text  # SQLite holds UTF-8 text only

# SQLite's primary result codes for a file the session can no longer use, with what stopped
# saving and what brings it back: a write the file cannot take, or a file damaged (or replaced)
# under the running app, which raised DatabaseError into it, and it quit.
_RESTART = "and restart to save again"
_CANNOT_WRITE = {
    5: ("another program holds the database locked",  # e.g. a DB browser with unsaved edits, for 5 s
        f"close that program {_RESTART}"),
    8: ("the database became read-only", f"make it and its directory writable {_RESTART}"),
    10: ("a disk I/O error", f"check the disk {_RESTART}"),
    11: ("the database file is damaged", "restart to save again (the damaged file is then kept aside)"),
    13: ("the disk is full", f"free some room {_RESTART}"),
    14: ("the database file cannot be opened", f"check the file and its directory {_RESTART}"),
    26: ("the database file was replaced by one that is not a database",
         "restart to save again (that file is then kept aside)"),
}
_CANNOT_WRITE_WORDS = (("database is locked", 5), ("readonly database", 8), ("disk I/O error", 10), ("malformed", 11),
                       ("disk is full", 13), ("unable to open database", 14), ("not a database", 26))


def encodable(params: tuple | list) -> tuple:
    """A statement's parameters with each text made `encodable_text`."""
    return tuple(encodable_text(p) if isinstance(p, str) else p for p in params)


def readable_text(data: bytes) -> str:
    """A stored text as a str (a connection's text_factory): bytes that are not UTF-8 (a bit
    flipped on disk, another program's write) read as U+FFFD where they stand. Python's default
    raised UnicodeDecodeError at resume, and the app could not start on the whole store."""
    return data.decode("utf-8", "replace")


def connect_memory() -> sqlite3.Connection:
    """A store connection in memory, reading text as the file's connection does."""
    mem = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    mem.text_factory = readable_text
    return mem


class Rows:
    """A statement's rows, all read at once: a damaged page met while reading them raises here,
    inside SavingConnection, and not from a cursor the store iterates later."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._rows = iter(cursor.fetchall())
        self.lastrowid = cursor.lastrowid

    def fetchone(self) -> tuple | None:
        return next(self._rows, None)

    def fetchall(self) -> list[tuple]:
        return list(self._rows)

    def __iter__(self) -> Iterator[tuple]:
        return self._rows


class SavingConnection:
    """The store's connection. A write the file can no longer take (a full disk, the file gone
    read-only) moves the session onto a copy in memory, as a store opened read-only runs, and
    says so once, instead of raising into the app, which quit and lost the message being saved."""

    def __init__(self, db: sqlite3.Connection, stopped: Callable[[str, str], None],
                 fresh: Callable[[sqlite3.Connection], None]) -> None:
        """`stopped(why, remedy)` hears once that saving stopped and what would bring it back;
        `fresh(db)` gives an empty store its schema."""
        self.db = db
        self._stopped = stopped
        self._fresh = fresh
        self._open: list[tuple[str, tuple]] | None = None  # the statements of an open transaction

    def execute(self, sql: str, params: tuple | list = ()) -> Rows:
        try:
            return self._execute(sql, params)
        except UnicodeEncodeError:  # checked only when it fails: a long reply is saved every 0.5 s
            return self._execute(sql, encodable(params))

    def _execute(self, sql: str, params: tuple | list) -> Rows:
        word = sql.lstrip()[:8].upper()
        try:
            cursor = Rows(self.db.execute(sql, params))
        except sqlite3.DatabaseError as e:  # OperationalError, or DatabaseError for a damaged file
            code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+; older ones by the message
            if code is None:
                code = next((c for key, c in _CANNOT_WRITE_WORDS if key in str(e)), 0)
            if code & 0xFF not in _CANNOT_WRITE:
                raise
            why, remedy = _CANNOT_WRITE[code & 0xFF]
            self._to_memory(f"{why} ({e})", remedy)
            cursor = Rows(self.db.execute(sql, params))
        if word.startswith("BEGIN"):
            self._open = [(sql, tuple(params))]
        elif word.startswith(("COMMIT", "ROLLBACK")):
            self._open = None
        elif self._open is not None:
            self._open.append((sql, tuple(params)))
        return cursor

    def executescript(self, script: str) -> sqlite3.Cursor:
        return self.db.executescript(script)

    def close(self) -> None:
        self.db.close()

    def _to_memory(self, why: str, remedy: str) -> None:
        old = self.db
        mem = connect_memory()
        copied = False
        try:
            if old.in_transaction:
                old.rollback()  # what it had done is done again below, in memory
            old.backup(mem)
            copied = True
            # A backup copies pages as they are: a damaged one would fail again, in memory.
            if [r[0] for r in mem.execute("PRAGMA quick_check")] != ["ok"]:  # (or raise itself)
                raise sqlite3.DatabaseError("the copy is damaged too")
            mem.execute("PRAGMA foreign_keys=ON")  # as the file had it
        except sqlite3.Error:  # a damaged page: go on with what can still be read of each table
            damaged = mem
            mem = connect_memory()
            self._fresh(mem)
            mem.execute("PRAGMA foreign_keys=OFF")  # rows on a damaged page are not in it
            _salvage(damaged if copied else old, mem)  # no copy: the file itself may still read in part
            damaged.close()
        with contextlib.suppress(sqlite3.Error):
            old.close()
        self.db = mem
        for sql, params in self._open or ():
            mem.execute(sql, params)
        self._stopped(why, remedy)


def _salvage(src: sqlite3.Connection, dst: sqlite3.Connection) -> None:
    """Copy into `dst` (an empty store of the current schema) the rows of each of its tables that
    `src` can still read: a table's copy stops at its first damaged page. Without it, a damaged
    file left the session an empty store: no workspace, no panes (new panes took names already
    open, and the conversation list was empty) and none of the messages that still read."""
    tables = [r[0] for r in dst.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                        "AND name NOT LIKE 'sqlite_%'")]
    for table in tables:
        columns = ", ".join(f'"{r[1]}"' for r in dst.execute(f'PRAGMA table_info("{table}")'))
        marks = ", ".join("?" * len(columns.split(", ")))
        rows: list = []
        try:
            cursor = src.execute(f'SELECT {columns} FROM "{table}"')
            while (row := cursor.fetchone()) is not None:  # one at a time: up to the damaged page
                rows.append(row)
        except sqlite3.Error:  # the table's next page is damaged (or the table cannot be read)
            pass
        dst.executemany(f'INSERT OR IGNORE INTO "{table}" ({columns}) VALUES ({marks})', rows)


class Transaction:
    def __init__(self, db: SavingConnection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
