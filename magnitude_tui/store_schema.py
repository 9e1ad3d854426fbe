"""Provides the store's schema: its tables (those of schema 1 and those added within it), the
check of a file's layout, forward migration, and creating it in an empty database."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS workspaces (
    id      INTEGER PRIMARY KEY,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS panes (
    id           TEXT PRIMARY KEY,           -- also the engine session id
    workspace_id INTEGER NOT NULL REFERENCES workspaces(id),
    name         TEXT NOT NULL,              -- "A1", "A1.2"
    role         TEXT NOT NULL,              -- "main" | "subagent"
    parent_id    TEXT REFERENCES panes(id),
    task         TEXT,
    position     INTEGER NOT NULL,
    created      REAL NOT NULL,
    closed       REAL                        -- NULL while the pane is open
);
CREATE TABLE IF NOT EXISTS messages (
    id          INTEGER PRIMARY KEY,
    pane_id     TEXT NOT NULL REFERENCES panes(id),
    role        TEXT NOT NULL,               -- "system" | "user" | "assistant"
    content     TEXT NOT NULL,
    complete    INTEGER NOT NULL,            -- 0 while a reply is still streaming (or was cut off)
    author      TEXT,                        -- set on a subagent's answer posted back to its parent
    done_reason TEXT,
    inherited   INTEGER NOT NULL DEFAULT 0,  -- copied from the parent when a subagent was spawned
    created     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_pane ON messages(pane_id, id);
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# The columns each table of the current schema must have: a file stamped with our version but
# laid out otherwise would fail later with "no such column" in the middle of a session.
COLUMNS = {
    "workspaces": {"id", "created"},
    "panes": {"id", "workspace_id", "name", "role", "parent_id", "task", "position", "created", "closed"},
    "messages": {"id", "pane_id", "role", "content", "complete", "author", "done_reason", "inherited",
                 "created"},
    "settings": {"key", "value"},
}

# MIGRATIONS[n] turns a database of schema n into schema n + 1, inside one transaction. Add one
# whenever SCHEMA_VERSION goes up, so every older file is carried forward, never rewritten.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}

# Tables added within schema 1, created on open (`add_tables`), so a file from before them gains them.
PANE_SETTINGS_TABLE = """
CREATE TABLE IF NOT EXISTS pane_settings (   -- a pane's agent settings, when not the defaults
    pane_id     TEXT PRIMARY KEY REFERENCES panes(id),
    role        TEXT,                        -- the agents.toml definition they came from
    system      TEXT NOT NULL,
    temperature REAL,                        -- NULL: the app's default
    max_tokens  INTEGER,
    top_p       REAL,
    min_p       REAL,
    tools       TEXT,                        -- a role's tools as a JSON list (NULL: every tool)
    approve     TEXT,                        -- ask | read-only | auto (NULL: ask)
    tool_choice TEXT                         -- its first turn's tool choice (NULL: auto)
);
"""
# Columns added to pane_settings after it first shipped (ALTER TABLE, once, on open).
PANE_SETTINGS_ADDED = {"top_p": "REAL", "min_p": "REAL", "tools": "TEXT", "approve": "TEXT", "tool_choice": "TEXT"}

QUEUED_TABLE = """
CREATE TABLE IF NOT EXISTS queued (          -- messages typed while a pane was replying, not sent yet
    pane_id  TEXT NOT NULL REFERENCES panes(id),
    position INTEGER NOT NULL,               -- the order they are sent in
    content  TEXT NOT NULL,
    PRIMARY KEY (pane_id, position)
);
"""

ANSWERS_TABLE = """
CREATE TABLE IF NOT EXISTS answers (         -- a reply's other answers, kept by retry (paged ‹k/n›)
    message_id INTEGER PRIMARY KEY REFERENCES messages(id),
    others     TEXT NOT NULL,                -- JSON list of the answers not shown, in order
    shown      INTEGER NOT NULL              -- the shown answer's place among all of them (from 0)
);
"""

TOOL_PARTS_TABLE = """
CREATE TABLE IF NOT EXISTS tool_parts (      -- an agent's tool calls and results among the messages
    message_id INTEGER PRIMARY KEY REFERENCES messages(id),
    calls      TEXT,                         -- an assistant turn's calls: JSON [[id, name, arguments], ...]
    call       TEXT,                         -- a tool result: the call it answers, JSON [id, name, arguments]
    ok         INTEGER NOT NULL DEFAULT 1,   -- a tool result: 0 when the tool failed (or was denied)
    duration_s REAL,                         -- a tool result: how long the tool ran
    approval_wait_s REAL                     -- a tool result: how long its approval took (NULL: not asked)
);
"""

# Columns added to tool_parts after it first shipped.
TOOL_PARTS_ADDED = {"approval_wait_s": "REAL"}


class StoreError(RuntimeError):
    """The database exists but must not be touched (e.g. written by a newer version)."""


class Unreadable(Exception):
    """The file is not a database of ours that this version can read: it is moved aside."""


def prepare(db: sqlite3.Connection, path: Path) -> int | None:
    """Check, migrate or create the schema, then add the tables added within it; returns the
    version migrated from (None: none)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"the database {path} has schema version {version}, written by a newer magnitude-tui "
            f"(this one reads up to {SCHEMA_VERSION}); upgrade magnitude-tui, or move the file "
            "away to start with an empty one")
    check = [r[0] for r in db.execute("PRAGMA quick_check")]
    if check != ["ok"]:
        raise Unreadable(f"integrity check failed: {'; '.join(check[:3])}")
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version == 0 and tables:
        raise Unreadable(f"it holds tables of another program ({', '.join(sorted(tables)[:5])}) "
                          "and no magnitude-tui schema version")
    if version == SCHEMA_VERSION:
        check_columns(db)
    # Only now is the file known to be ours: switching to WAL rewrites its header.
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    migrated_from = None
    if version == 0:
        db.executescript(SCHEMA)
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    elif version < SCHEMA_VERSION:
        migrated_from = version
        db.execute("BEGIN")
        try:
            for v in range(version, SCHEMA_VERSION):
                if v not in MIGRATIONS:
                    raise Unreadable(f"no migration from schema version {v}")
                MIGRATIONS[v](db)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        check_columns(db)
    add_tables(db)
    return migrated_from


def check_columns(db: sqlite3.Connection) -> None:
    for table, wanted in COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        missing = wanted - have
        if missing:
            what = "is missing" if have else "has no table"
            raise Unreadable(f"it is stamped schema {SCHEMA_VERSION} but {what} "
                              f"{table}({', '.join(sorted(missing))})")


def fresh_store(db: sqlite3.Connection) -> None:
    """An empty store's schema, for a session that can no longer read its file."""
    prepare(db, Path(":memory:"))


def add_tables(db: sqlite3.Connection) -> None:
    """Tables and columns added within schema 1, idempotently: a database from before them
    simply gains them."""
    db.executescript(PANE_SETTINGS_TABLE + QUEUED_TABLE + ANSWERS_TABLE + TOOL_PARTS_TABLE)
    for table, added in (("pane_settings", PANE_SETTINGS_ADDED), ("tool_parts", TOOL_PARTS_ADDED)):
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for column, kind in added.items():
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
