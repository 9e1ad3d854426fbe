"""Provides SavingConnection: the store's SQLite connection, which goes on in memory when the file
can no longer take a write, and Transaction over it."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from typing import Callable

# SQLite's primary result codes for a write the file can no longer take.
_CANNOT_WRITE = {8: "the database became read-only", 10: "a disk I/O error", 13: "the disk is full",
                 14: "the database file cannot be opened"}
_CANNOT_WRITE_WORDS = (("readonly database", _CANNOT_WRITE[8]), ("disk I/O error", _CANNOT_WRITE[10]),
                       ("disk is full", _CANNOT_WRITE[13]), ("unable to open database", _CANNOT_WRITE[14]))


# Lone surrogates (a JSON "\ud800" escape from a remote server, bytes that are not UTF-8 in a
# file name): SQLite holds UTF-8 text only, and encoding one raised into the app, which quit.
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable_text(text: str) -> str:
    """`text` with every lone surrogate shown as U+FFFD, as a UTF-8 reader shows a byte it cannot
    read (the rest of the text is kept as it is): what a UTF-8 file or database can hold."""
    return _SURROGATE.sub("\ufffd", text)


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


class SavingConnection:
    """The store's connection. A write the file can no longer take (a full disk, the file gone
    read-only) moves the session onto a copy in memory, as a store opened read-only runs, and
    says so once, instead of raising into the app, which quit and lost the message being saved."""

    def __init__(self, db: sqlite3.Connection, stopped: Callable[[str], None],
                 fresh: Callable[[sqlite3.Connection], None]) -> None:
        """`stopped(why)` hears once that saving stopped; `fresh(db)` gives an empty store its schema."""
        self.db = db
        self._stopped = stopped
        self._fresh = fresh
        self._open: list[tuple[str, tuple]] | None = None  # the statements of an open transaction

    def execute(self, sql: str, params: tuple | list = ()) -> sqlite3.Cursor:
        try:
            return self._execute(sql, params)
        except UnicodeEncodeError:  # checked only when it fails: a long reply is saved every 0.5 s
            return self._execute(sql, encodable(params))

    def _execute(self, sql: str, params: tuple | list) -> sqlite3.Cursor:
        word = sql.lstrip()[:8].upper()
        try:
            cursor = self.db.execute(sql, params)
        except sqlite3.OperationalError as e:
            code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+; older ones by the message
            why = _CANNOT_WRITE.get(code & 0xFF) if code is not None else next(
                (w for key, w in _CANNOT_WRITE_WORDS if key in str(e)), None)
            if why is None:
                raise
            self._to_memory(f"{why} ({e})")
            cursor = self.db.execute(sql, params)
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

    def _to_memory(self, why: str) -> None:
        old = self.db
        mem = connect_memory()
        try:
            if old.in_transaction:
                old.rollback()  # what it had done is done again below, in memory
            old.backup(mem)
            mem.execute("PRAGMA foreign_keys=ON")  # as the file had it
        except sqlite3.Error:  # the file cannot even be read now: go on with an empty store
            mem.close()
            mem = connect_memory()
            self._fresh(mem)
            mem.execute("PRAGMA foreign_keys=OFF")  # the panes of this session are not in it
        with contextlib.suppress(sqlite3.Error):
            old.close()
        self.db = mem
        for sql, params in self._open or ():
            mem.execute(sql, params)
        self._stopped(why)


class Transaction:
    def __init__(self, db: SavingConnection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type, exc, tb) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
