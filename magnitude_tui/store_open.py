"""Provides open_database: the store's file opened, locked and checked (store_schema.py), and
recovery from a file that cannot be read or written."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from magnitude_tui.store_saving import connect_memory, readable_text
from magnitude_tui.store_schema import StoreError, Unreadable, prepare

# Lock files held by this process: path -> [the open lock file, connections holding it]. Another
# process that opens the same store is refused; this process may open it again (a resume).
_HELD: dict[str, list] = {}


class _Connection(sqlite3.Connection):
    """A store connection that holds its store's instance lock (`<db>.lock`, flock) until it is
    closed or collected: two apps writing one conversation would interleave it."""

    _lock_key: str | None = None

    def hold_instance_lock(self, path: Path) -> None:
        lock_path = Path(f"{path}.lock")
        key = os.path.realpath(lock_path)
        held = _HELD.get(key)
        if held is not None:
            held[1] += 1
            self._lock_key = key
            return
        try:
            f = open(lock_path, "a+")
        except OSError:
            return  # nowhere to put a lock (a read-only place is handled before this)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            other = f.read().strip()[:20]
            f.close()
            raise StoreError(f"another magnitude-tui{f' (pid {other})' if other.isdigit() else ''} is "
                             f"using {path}; quit it first (two apps on one store would interleave "
                             "their conversations)") from None
        try:  # the pid only names the holder in a refusal: a full disk must not stop the app
            os.ftruncate(f.fileno(), 0)  # unbuffered, so closing the file has nothing left to fail on
            os.pwrite(f.fileno(), str(os.getpid()).encode(), 0)
        except OSError:
            pass
        _HELD[key] = [f, 1]
        self._lock_key = key

    def close(self) -> None:
        super().close()
        self._release()

    def __del__(self) -> None:
        self._release()

    def _release(self) -> None:
        key, self._lock_key = self._lock_key, None
        held = _HELD.get(key) if key is not None else None
        if key is not None and held is not None:
            held[1] -= 1
            if held[1] <= 0:
                del _HELD[key]
                held[0].close()


class _LostFile(Unreadable):
    """The database file is empty or missing but its -wal holds pages of it."""


class _ReadOnly(Exception):
    """The file (or its directory) cannot be written: the session runs on a copy in memory."""


class _DiskFull(_ReadOnly):
    """The disk has no room for the store to be created or opened: as read-only, until room is freed."""


@dataclass
class Opened:
    db: sqlite3.Connection
    moved_to: Path | None  # where an unreadable file went (None: nothing was moved)
    why: str | None  # what was wrong with it
    migrated_from: int | None  # the schema version the file had before migrating forward
    read_only: str | None = None  # why nothing will be saved (the store runs on a copy in memory)
    disk_full: bool = False  # read_only because the disk is full (the remedy is room, not permissions)
    recovered: int | None = None  # messages rebuilt from the -wal of a lost file (None: none tried)


def open_database(path: Path) -> Opened:
    """Open (or create) the store at `path` on schema SCHEMA_VERSION.

    A corrupt file, or one that is not a database of ours, is renamed to
    `<name>.unreadable-<time>` (with its -wal and -shm files: never deleted) and a new one is
    started; the caller tells the user where it went. A newer schema raises StoreError (the file
    belongs to a newer version of the app, which still reads it). A file or directory that cannot
    be written is read into memory (or an empty store starts there) and `read_only` says why:
    the app shows the history and goes on, saving nothing.
    """
    try:
        db, migrated_from = _open(path)
        return Opened(db, None, None, migrated_from)
    except _ReadOnly as e:
        opened = _open_copy(path, str(e))
        opened.disk_full = isinstance(e, _DiskFull)
        return opened
    except Unreadable as e:
        if str(path) == ":memory:":
            raise StoreError(f"the in-memory database is unusable: {e}") from None
        moved = _move_aside(path)
        recovered = None
        if isinstance(e, _LostFile):  # `moved` is the kept file, or the kept -wal where none was
            wal = moved if moved.name.endswith("-wal") else moved.with_name(moved.name + "-wal")
            recovered = _rebuild_from_wal(wal, path)
        try:
            db, migrated_from = _open(path)
        except Unreadable:
            if recovered is None:
                raise
            # The rebuild read as a database but not as ours (a log written before the schema
            # was stamped): it is this function's own file, dropped; the log stays kept.
            for own in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                with contextlib.suppress(OSError):
                    own.unlink()
            recovered = None
            db, migrated_from = _open(path)
        return Opened(db, moved, str(e), migrated_from, recovered=recovered)


def read_only_reason(path: Path) -> str | None:
    """Why the store at `path` cannot be written (None: it can, as far as the system says)."""
    if str(path) == ":memory:":
        return None
    if path.exists() and not os.access(path, os.W_OK):
        return f"the file {path} is read-only"
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the nearest existing ancestor is where it would be created
    if not os.access(directory, os.W_OK):
        return f"the directory {directory} is read-only"
    return None


def _file_in_the_way(path: Path) -> Path | None:
    """The file that stands where a directory above `path` must be (None: nothing does)."""
    if str(path) == ":memory:":
        return None
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return directory if directory.exists() and not directory.is_dir() else None


def _check_header(path: Path) -> None:
    # Read the header before SQLite does: opening a file that is not a database may make SQLite
    # tidy away a -wal beside it, and nothing of the user's is ever removed.
    if str(path) == ":memory:":
        return
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                raise Unreadable("file is not a database")
        return
    # SQLite deletes a -wal beside an empty or missing database as stale, and with it every
    # conversation not yet checkpointed into the file (a zero-length file after a crash, a copy
    # that missed the main file). Ours never leaves one there: the file has its header first.
    wal = path.with_name(path.name + "-wal")
    if wal.is_file() and wal.stat().st_size:
        state = "empty" if path.exists() else "missing"
        raise _LostFile(f"the file is {state} but its write-ahead log {wal.name} holds "
                          f"{wal.stat().st_size:,} bytes of it")


def _open(path: Path) -> tuple[sqlite3.Connection, int | None]:
    if path.is_dir():
        raise StoreError(f"the database path {path} is a directory; pass a file (it is created if missing)")
    blocker = _file_in_the_way(path)
    if blocker is not None:  # SQLite would say only "unable to open database file"
        raise StoreError(f"cannot create the database {path}: {blocker} is a file, not a directory; "
                         "move it away (or point the data directory, XDG_DATA_HOME, elsewhere)")
    reason = read_only_reason(path)
    if reason is not None:
        raise _ReadOnly(reason)
    _check_header(path)
    try:
        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, factory=_Connection)
    except sqlite3.Error as e:
        raise StoreError(f"could not open the database {path}: {e}") from None
    db.text_factory = readable_text
    try:
        if str(path) != ":memory:":
            db.hold_instance_lock(path)
        return db, prepare(db, path)
    except Unreadable:
        db.close()
        raise
    except sqlite3.OperationalError as e:  # locked by another instance, read-only, no access
        db.close()
        if "readonly" in str(e) or "read-only" in str(e):  # e.g. a read-only mount
            raise _ReadOnly(f"SQLite cannot write {path}: {e}") from None
        if getattr(e, "sqlite_errorcode", 0) & 0xFF == 13 or "disk is full" in str(e):
            # SQLITE_FULL (13). Not a lock or permissions: said so, the user looked for another app.
            raise _DiskFull(f"the disk is full ({e})") from None
        raise StoreError(f"could not open the database {path}: {e}; close any other magnitude-tui "
                         "using it and check the file's permissions") from None
    except sqlite3.DatabaseError as e:  # "file is not a database", "disk image is malformed"
        db.close()
        raise Unreadable(str(e)) from None
    except UnicodeDecodeError as e:
        db.close()
        raise Unreadable(_damaged_message(e)) from None
    except BaseException:
        db.close()
        raise


def _damaged_message(e: UnicodeDecodeError) -> str:
    """SQLite's message about a damaged file, which quoted bytes of it that are not UTF-8 (a
    flipped bit in a table's name): Python's sqlite3 raised UnicodeDecodeError for it instead of
    DatabaseError, past every handler, and the app could not start."""
    return bytes(e.object).decode("utf-8", "replace")


def _rebuild_from_wal(wal: Path, path: Path) -> int | None:
    """A store at `path` rebuilt from the -wal (moved aside, and left there) of a database whose
    file was lost: the log holds every page written since the last checkpoint, often all of a
    young store. Put behind a blank header page of its page size, SQLite reads them as it would
    have; the result is kept only if it passes quick_check and holds our messages table. Returns
    how many messages it holds (None: nothing usable; the caller starts an empty store)."""
    try:
        with open(wal, "rb") as f:
            header = f.read(32)
        page_size = int.from_bytes(header[8:12], "big")
        if header[:4] not in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83") or page_size not in {
                1 << k for k in range(9, 17)}:
            return None
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            blank, work = Path(tmp, "blank.db"), Path(tmp, "work.db")
            db = sqlite3.connect(blank)
            db.execute(f"PRAGMA page_size={page_size}")
            db.execute("PRAGMA journal_mode=WAL")  # the header byte that makes SQLite read the log
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            work.write_bytes(blank.read_bytes()[:page_size])
            shutil.copyfile(wal, Path(f"{work}-wal"))  # a copy: the kept log is never touched
            src = sqlite3.connect(work)
            src.text_factory = readable_text
            try:
                if [r[0] for r in src.execute("PRAGMA quick_check")] != ["ok"]:
                    return None
                count = src.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
                out = sqlite3.connect(path)
                try:
                    src.backup(out)
                finally:
                    out.close()
            finally:
                src.close()
        return count
    except (sqlite3.Error, OSError, UnicodeDecodeError):
        with contextlib.suppress(OSError):
            path.unlink()  # a half-written rebuild (this function's own file), never the user's
        return None


def _open_copy(path: Path, reason: str) -> Opened:
    """The store read into memory from a file that cannot be written (or empty, if there is none
    or it cannot be read): the session shows what was saved and saves nothing."""
    mem = connect_memory()
    why = reason
    try:
        _check_header(path)
        if path.is_file() and path.stat().st_size:
            _copy_into(path, mem)
        migrated_from = prepare(mem, path)
    except (Unreadable, sqlite3.DatabaseError, OSError, UnicodeDecodeError) as e:
        if isinstance(e, UnicodeDecodeError):
            e = Unreadable(_damaged_message(e))
        mem.close()
        mem = connect_memory()
        migrated_from = prepare(mem, path)
        why = f"{reason}, and it could not be read either ({e}); it was left as it is"
    return Opened(mem, None, None, migrated_from, read_only=why)


def _copy_into(path: Path, mem: sqlite3.Connection) -> None:
    # mode=ro still wants to create the -shm of a WAL database; where the directory is read-only
    # too, immutable=1 reads the file as it is (without a -wal it may hold).
    last: Exception | None = None
    for flags in ("mode=ro", "immutable=1"):
        try:
            src = sqlite3.connect(f"{path.resolve().as_uri()}?{flags}", uri=True)
        except sqlite3.Error as e:
            last = e
            continue
        try:
            src.backup(mem)
            return
        except sqlite3.Error as e:
            last = e
        finally:
            src.close()
    raise sqlite3.DatabaseError(str(last))


def _move_aside(path: Path) -> Path:
    """Rename the file and its WAL companions; a stale -wal next to a new file would corrupt it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.unreadable-{stamp}")
    n = 1
    while any(target.with_name(target.name + s).exists() for s in ("", "-wal", "-shm", "-journal")):
        n += 1
        target = path.with_name(f"{path.name}.unreadable-{stamp}-{n}")
    moved = None
    if path.exists():
        path.rename(target)
        moved = target
    for suffix in ("-wal", "-shm", "-journal"):
        companion = path.with_name(path.name + suffix)
        if companion.exists():
            companion.rename(target.with_name(target.name + suffix))
            moved = moved or target.with_name(target.name + suffix)  # a -wal without its file
    return moved or target
