"""Provides the SQLite store that keeps panes and transcripts across runs and crashes."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, TypeVar

import platformdirs

from magnitude_tui.agent.policy import ApprovePolicy
from magnitude_tui.agents import AgentSettings
from magnitude_tui.records import MessageRecord, PaneRecord
from magnitude_tui.store_open import open_database
from magnitude_tui.store_saving import SavingConnection, Transaction
from magnitude_tui.store_schema import SCHEMA_VERSION, StoreError, fresh_store
from scheduler.types import ToolCall, ToolChoiceMode

__all__ = ["SCHEMA_VERSION", "MessageRecord", "PaneRecord", "Store", "StoreError", "default_db_path"]

TITLE_CHARS = 40  # a conversation's title: the first user message cut at a word within this


def short_title(text: str, limit: int = TITLE_CHARS) -> str:
    """A conversation's title from its first message: the first line, spaces collapsed, cut at a
    word boundary with an ellipsis when longer than `limit`."""
    line = " ".join(next((l for l in text.splitlines() if l.strip()), "").split())
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,.;:") + "…"


def snippet(text: str, needle: str, width: int = 60) -> str:
    """The part of `text` around the first case-insensitive occurrence of `needle`, on one line."""
    flat = " ".join(text.split())
    at = flat.lower().find(needle.lower())
    if at < 0:
        return ""
    start = max(0, at - (width - len(needle)) // 2)
    part = flat[start:start + width]
    return f"{'…' if start else ''}{part}{'…' if start + width < len(flat) else ''}"


def default_db_path() -> Path:
    """The database in the user's data directory (created on first use)."""
    return Path(platformdirs.user_data_dir("magnitude-tui", appauthor=False)) / "magnitude.db"


@dataclass(frozen=True)
class ConversationRow:
    """One line of the conversation list: a pane of any workspace, open or closed."""

    id: str
    name: str
    role: str
    workspace_id: int
    is_open: bool  # open in the current workspace
    closed: float | None
    messages: int
    preview: str  # the conversation's title: the first thing the user asked, shortened
    updated: float  # the newest message's time (or the pane's creation)
    match: str = ""  # with a search: where a message says it (when the title does not)


class Store:
    """Durable home of every conversation; the engine worker only ever holds a disposable copy.

    Writes are single statements in autocommit mode on a WAL database, so a killed process loses
    only what the app had not yet handed over (streaming replies are saved on a short timer).
    Opening checks the schema version (migrating older files forward, refusing newer ones with
    StoreError) and moves an unreadable file aside instead of failing; `notice` then says where.
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        if str(self.path) != ":memory:":
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError:
                pass  # a read-only place: open_database runs the session in memory and says why
        opened = open_database(self.path)
        self._db = SavingConnection(opened.db, self._saving_stopped, fresh=fresh_store)
        # Called with what to tell the user when saving stops mid-session (the app notifies).
        self.on_notice: Callable[[str], None] | None = None
        self.moved_to = opened.moved_to
        self.migrated_from = opened.migrated_from
        # What the user must be told on start (an unreadable file was moved aside), or None.
        self.notice: str | None = None
        # Why nothing will be saved this session (None: everything is saved as usual).
        self.read_only = opened.read_only
        if opened.moved_to is not None and opened.recovered is not None:
            self.notice = (f"The database {self.path} could not be read ({opened.why}). It was moved "
                           f"to {opened.moved_to}, and the {opened.recovered} messages its log held "
                           "were recovered into a new one.")
        elif opened.moved_to is not None:
            self.notice = (f"The database {self.path} could not be read ({opened.why}). It was moved "
                           f"to {opened.moved_to} and a new, empty one was started.")
        elif opened.read_only is not None:
            remedy = ("free some room on its disk" if opened.disk_full
                      else f"make {self.path} and its directory writable")
            self.notice = (f"History will not be saved: {opened.read_only}. This session runs on a copy "
                           f"in memory; {remedy} and restart to save again.")
        self.workspace_id: int | None = None

    # ---- workspaces ---------------------------------------------------------------------------

    def open_workspace(self, *, resume: bool) -> list[PaneRecord]:
        """Start a fresh workspace, or reopen the latest one that holds a conversation and return
        its open panes in order (a launch that was quit untouched leaves an empty workspace
        behind, which must not hide the session before it)."""
        row = self._db.execute(
            "SELECT w.id FROM workspaces w WHERE EXISTS (SELECT 1 FROM panes p JOIN messages m "
            "ON m.pane_id = p.id WHERE p.workspace_id = w.id AND p.closed IS NULL) "
            "ORDER BY w.id DESC LIMIT 1").fetchone()
        if resume and row is not None:
            self.workspace_id = row[0]
            return self._load_open_panes()
        self.workspace_id = self._db.execute(
            "INSERT INTO workspaces (created) VALUES (?)", (time.time(),)
        ).lastrowid
        return []

    def _load_open_panes(self) -> list[PaneRecord]:
        rows = self._db.execute(
            "SELECT id, name, role, parent_id, task, position FROM panes "
            "WHERE workspace_id = ? AND closed IS NULL ORDER BY position, created",
            (self.workspace_id,),
        ).fetchall()
        panes = [PaneRecord(*row) for row in rows]
        for pane in panes:
            pane.messages = self.messages(pane.id)
            pane.settings = self.pane_settings(pane.id)
            pane.queued = self.queued(pane.id)
        return panes

    def workspace_panes(self, workspace_id: int) -> list[str]:
        """The panes that were open when `workspace_id` was last used, in their order (what
        reopening that whole workspace brings back)."""
        rows = self._db.execute("SELECT id FROM panes WHERE workspace_id = ? AND closed IS NULL "
                                "ORDER BY position, created", (workspace_id,))
        return [r[0] for r in rows]

    def pane_names(self) -> list[str]:
        """The names of the panes open in this workspace: a closed pane's name, or the name a pane
        was renamed from, is free for the next new pane (a reopened pane that clashes is renamed)."""
        rows = self._db.execute("SELECT name FROM panes WHERE workspace_id = ? AND closed IS NULL",
                                (self.workspace_id,))
        return [r[0] for r in rows]

    # ---- panes --------------------------------------------------------------------------------

    def add_pane(self, pane: PaneRecord) -> None:
        assert self.workspace_id is not None, "open_workspace() first"
        self._db.execute(
            "INSERT INTO panes (id, workspace_id, name, role, parent_id, task, position, created) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (pane.id, self.workspace_id, pane.name, pane.role, pane.parent_id, pane.task,
             pane.position, time.time()),
        )
        for message in pane.messages:
            self.add_message(pane.id, message)
        if not pane.settings.is_default:
            self.set_pane_settings(pane.id, pane.settings)

    def set_pane_settings(self, pane_id: str, settings: AgentSettings) -> None:
        self._db.execute(
            "INSERT INTO pane_settings (pane_id, role, system, temperature, max_tokens, top_p, min_p, tools, approve, "
            "tool_choice) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(pane_id) DO UPDATE SET role = excluded.role, system = excluded.system, "
            "temperature = excluded.temperature, max_tokens = excluded.max_tokens, top_p = excluded.top_p, "
            "min_p = excluded.min_p, tools = excluded.tools, approve = excluded.approve, "
            "tool_choice = excluded.tool_choice",
            (pane_id, settings.role, settings.system, settings.temperature, settings.max_tokens,
             settings.top_p, settings.min_p, None if settings.tools is None else json.dumps(list(settings.tools)),
             settings.approve and settings.approve.value, settings.tool_choice and settings.tool_choice.value),
        )

    def pane_settings(self, pane_id: str) -> AgentSettings:
        row = self._db.execute("SELECT role, system, temperature, max_tokens, top_p, min_p, tools, approve, tool_choice "
                               "FROM pane_settings WHERE pane_id = ?", (pane_id,)).fetchone()
        if not row:
            return AgentSettings()
        role, system, temperature, max_tokens, top_p, min_p, tools, approve, tool_choice = row
        return AgentSettings(role, system, temperature, max_tokens, top_p, min_p, tools=_tools(tools),
                             approve=_enum(ApprovePolicy, approve), tool_choice=_enum(ToolChoiceMode, tool_choice))

    def close_pane(self, pane_id: str) -> None:
        self._db.execute("UPDATE panes SET closed = ? WHERE id = ?", (time.time(), pane_id))

    def set_positions(self, pane_ids: list[str]) -> None:
        with self._transaction():
            for position, pane_id in enumerate(pane_ids):
                self._db.execute("UPDATE panes SET position = ? WHERE id = ?", (position, pane_id))

    def reopen_pane(self, pane_id: str, position: int) -> PaneRecord:
        """Open a closed pane (of any workspace) in the current workspace, with its messages."""
        self._db.execute("UPDATE panes SET closed = NULL, workspace_id = ?, position = ? WHERE id = ?",
                         (self.workspace_id, position, pane_id))
        row = self._db.execute("SELECT id, name, role, parent_id, task, position FROM panes WHERE id = ?",
                               (pane_id,)).fetchone()
        if row is None:
            raise KeyError(f"no conversation {pane_id!r}")
        pane = PaneRecord(*row)
        pane.messages = self.messages(pane_id)
        pane.settings = self.pane_settings(pane_id)
        pane.queued = self.queued(pane_id)
        return pane

    def rename_pane(self, pane_id: str, name: str) -> None:
        self._db.execute("UPDATE panes SET name = ? WHERE id = ?", (name, pane_id))

    def delete_pane(self, pane_id: str) -> None:
        """Forget a conversation and its messages (its subagents lose their parent link)."""
        with self._transaction():
            self._db.execute("UPDATE panes SET parent_id = NULL WHERE parent_id = ?", (pane_id,))
            for table in ("answers", "tool_parts"):
                self._db.execute(f"DELETE FROM {table} WHERE message_id IN (SELECT id FROM messages "
                                 "WHERE pane_id = ?)", (pane_id,))
            self._db.execute("DELETE FROM messages WHERE pane_id = ?", (pane_id,))
            self._db.execute("DELETE FROM pane_settings WHERE pane_id = ?", (pane_id,))
            self._db.execute("DELETE FROM queued WHERE pane_id = ?", (pane_id,))
            self._db.execute("DELETE FROM panes WHERE id = ?", (pane_id,))

    def conversations(self, search: str = "") -> list[ConversationRow]:
        """Every conversation, newest activity first; `search` matches names and message text."""
        like = _like(search.strip())
        rows = self._db.execute(
            "SELECT p.id, p.name, p.role, p.workspace_id, p.closed, "
            # What the pane shows as messages: not tool results (blocks) or turns that only called tools.
            "(SELECT COUNT(*) FROM messages m WHERE m.pane_id = p.id AND m.inherited = 0 "
            " AND m.role != 'tool' AND m.content != ''), "
            "(SELECT content FROM messages m WHERE m.pane_id = p.id AND m.role = 'user' "
            " AND m.inherited = 0 ORDER BY id LIMIT 1), "
            "COALESCE((SELECT MAX(created) FROM messages m WHERE m.pane_id = p.id), p.created) AS updated "
            "FROM panes p WHERE (? = '%%' OR p.name LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m "
            " WHERE m.pane_id = p.id AND m.content LIKE ? ESCAPE '\\')) ORDER BY updated DESC",
            (like, like, like),
        ).fetchall()
        needle = search.strip()
        return [ConversationRow(r[0], r[1], r[2], r[3], r[3] == self.workspace_id and r[4] is None,
                                r[4], r[5], short_title(r[6] or "", 60), r[7],
                                self._match(r[0], needle) if needle and needle.lower() not in
                                f"{r[1]} {r[6] or ''}".lower() else "") for r in rows]

    def _match(self, pane_id: str, needle: str) -> str:
        row = self._db.execute("SELECT content FROM messages WHERE pane_id = ? AND content LIKE ? ESCAPE '\\' "
                               "ORDER BY id LIMIT 1", (pane_id, _like(needle))).fetchone()
        return snippet(row[0], needle) if row else ""

    def set_queued(self, pane_id: str, texts: list[str]) -> None:
        """The pane's queued messages are now exactly `texts` (in the order they will be sent)."""
        with self._transaction():
            self._db.execute("DELETE FROM queued WHERE pane_id = ?", (pane_id,))
            for i, text in enumerate(texts):
                self._db.execute("INSERT INTO queued (pane_id, position, content) VALUES (?, ?, ?)",
                                 (pane_id, i, text))

    def queued(self, pane_id: str) -> list[str]:
        rows = self._db.execute("SELECT content FROM queued WHERE pane_id = ? ORDER BY position", (pane_id,))
        return [r[0] for r in rows]

    # ---- messages -----------------------------------------------------------------------------

    def add_message(self, pane_id: str, message: MessageRecord) -> int:
        """Insert a message and give it its id (later saves of the same message update it)."""
        row_id = self._db.execute(
            "INSERT INTO messages (pane_id, role, content, complete, author, done_reason, inherited, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (pane_id, message.role, message.content, int(message.complete), message.author,
             message.done_reason, int(message.inherited), time.time()),
        ).lastrowid
        assert row_id is not None  # set by every INSERT
        message.id = row_id
        if message.others:
            self._save_answers(message)
        if message.has_tool_part:
            self._save_tool_part(message)
        return row_id

    def save_messages(self, messages: list[MessageRecord]) -> None:
        """Write the current content of already-inserted messages, all in one transaction."""
        if not messages:
            return
        with self._transaction():
            for m in messages:
                self._db.execute(
                    "UPDATE messages SET content = ?, complete = ?, done_reason = ? WHERE id = ?",
                    (m.content, int(m.complete), m.done_reason, m.id),
                )
                if m.others:
                    self._save_answers(m)
                if m.has_tool_part:
                    self._save_tool_part(m)

    def _save_tool_part(self, m: MessageRecord) -> None:
        calls = json.dumps([[c.id, c.name, c.arguments] for c in m.tool_calls]) if m.tool_calls else None
        call = json.dumps([m.call.id, m.call.name, m.call.arguments]) if m.call is not None else None
        self._db.execute(
            "INSERT INTO tool_parts (message_id, calls, call, ok, duration_s, approval_wait_s) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(message_id) DO UPDATE SET calls = excluded.calls, "
            "call = excluded.call, ok = excluded.ok, duration_s = excluded.duration_s, "
            "approval_wait_s = excluded.approval_wait_s",
            (m.id, calls, call, int(m.ok), m.duration_s, m.approval_wait_s))

    def _save_answers(self, m: MessageRecord) -> None:
        self._db.execute(
            "INSERT INTO answers (message_id, others, shown) VALUES (?, ?, ?) ON CONFLICT(message_id) "
            "DO UPDATE SET others = excluded.others, shown = excluded.shown",
            (m.id, json.dumps(m.others), m.shown))

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM answers WHERE message_id = ?", (message_id,))
        self._db.execute("DELETE FROM tool_parts WHERE message_id = ?", (message_id,))
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def messages(self, pane_id: str) -> list[MessageRecord]:
        rows = self._db.execute(
            "SELECT m.role, m.content, m.complete, m.author, m.done_reason, m.inherited, m.id, a.others, "
            "a.shown, t.calls, t.call, t.ok, t.duration_s, t.approval_wait_s FROM messages m "
            "LEFT JOIN answers a ON a.message_id = m.id LEFT JOIN tool_parts t ON t.message_id = m.id "
            "WHERE m.pane_id = ? ORDER BY m.id",
            (pane_id,),
        )
        return [MessageRecord(r[0], r[1], bool(r[2]), r[3], r[4], bool(r[5]), r[6],
                              json.loads(r[7]) if r[7] else [], r[8] or 0, tool_calls=_calls(r[9]),
                              call=next(iter(_calls(r[10], one=True)), None), ok=r[11] is None or bool(r[11]),
                              duration_s=r[12] if r[10] else 0.0, approval_wait_s=r[13]) for r in rows]

    # ---- settings -----------------------------------------------------------------------------

    def get_setting(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_setting(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO settings (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def close(self) -> None:
        self._db.close()

    def _saving_stopped(self, why: str, remedy: str) -> None:
        self.read_only = why
        message = f"History is no longer saved: {why}. This session goes on with a copy in memory; {remedy}."
        if self.on_notice is not None:
            self.on_notice(message)

    def _transaction(self) -> Transaction:
        return Transaction(self._db)


def _like(needle: str) -> str:
    """A LIKE pattern (ESCAPE '\\') for text holding `needle` as typed: `%` and `_` are LIKE's
    wildcards, and a search for "%" or "_" matched every conversation, "file_name" "file name"."""
    return "%" + needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


_E = TypeVar("_E", bound=Enum)


def _enum(kind: type[_E], value: str | None) -> _E | None:
    """A stored enum value; one this version does not know reads as the default (None). Where
    that default is looser (approve: ask), the user is still asked before anything is written or run."""
    try:
        return None if value is None else kind(value)
    except ValueError:
        return None


def _tools(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    try:
        names = json.loads(text)
    except ValueError:
        return ()  # unreadable: no tools rather than every tool
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def _calls(text: str | None, *, one: bool = False) -> tuple[ToolCall, ...]:
    """Stored calls (a JSON list of [id, name, arguments], or `one` such triple); what does not
    read as that is left out."""
    if not text:
        return ()
    try:
        rows = json.loads(text)
    except ValueError:
        return ()
    rows = [rows] if one else rows
    if not isinstance(rows, list):
        return ()
    return tuple(ToolCall(*r) for r in rows
                 if isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) for x in r))
