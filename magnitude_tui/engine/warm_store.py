"""Provides WarmStore: conversations' saved KV states on disk, under a byte budget (least
recently used dropped first)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

log = logging.getLogger("magnitude_tui.warm")

# A file: MAGIC, u32 header length, the header (JSON), the tokens (int32 LE), the state bytes.
MAGIC = b"MAGKV01\n"
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"  # a state being written, renamed to SUFFIX once whole
STALE_TMP_S = 600.0  # a temporary this old was left by a writer that died


class Found(str, Enum):
    """What a lookup found for a conversation."""

    STATE = "state"
    NOTHING = "nothing"
    OTHER_LAYOUT = "other_layout"  # only states saved under another layout
    DAMAGED = "damaged"


@dataclass
class SavedState:
    session_id: str
    tokens: list[int]
    state: bytearray
    size: int  # bytes on disk


@dataclass
class Lookup:
    found: Found
    saved: SavedState | None = None
    detail: str = ""


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


class WarmStore:
    """One file per conversation and layout in `directory`. Writes go through one background
    thread (a state is tens of MB; the engine thread only copies it out of the KV cache) and land
    atomically (a temporary file renamed), so a crash leaves the old file or the new one, never half
    of one. After each write the oldest files (by last save or load) go until the directory fits
    `budget_bytes`. A file is checked (magic, lengths, layout, CRC) before its state is handed to a
    backend: a damaged one is reported and deleted, never loaded."""

    def __init__(self, directory: Path | str, *, layout: str, budget_bytes: int) -> None:
        self.directory = Path(directory)
        self.layout = layout
        self.budget_bytes = budget_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(self.directory)
        self._lock = threading.Condition()
        self._pending: dict[str, tuple[list[int], bytes]] = {}  # session -> newest unsaved state
        self._writing = False
        self._writing_id: str | None = None  # the conversation whose state is being written now
        self._closed = False
        self._thread: threading.Thread | None = None
        self.num_written = 0
        self.num_evicted = 0
        self.last_write_ms = 0.0

    # ---- names --------------------------------------------------------------------------------

    def path_for(self, session_id: str, layout: str | None = None) -> Path:
        return self.directory / f"{_digest(session_id, 20)}.{_digest(layout or self.layout, 12)}{SUFFIX}"

    def _files_of(self, session_id: str) -> list[Path]:  # every layout's
        return sorted(self.directory.glob(f"{_digest(session_id, 20)}.*{SUFFIX}"))

    def files(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"))

    # ---- saving -------------------------------------------------------------------------------

    def save(self, session_id: str, tokens: list[int], state: bytes) -> None:
        """Queue a state for the writer thread (a newer one for the same conversation replaces it)."""
        with self._lock:
            if self._closed:
                return
            self._pending[session_id] = (list(tokens), state)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="warm-writer", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued state is on disk; False if `timeout` ran out first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._writing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending:
                    return
                session_id = next(iter(self._pending))
                tokens, state = self._pending.pop(session_id)
                self._writing, self._writing_id = True, session_id
            try:
                self.write(session_id, tokens, state)
            except OSError as exc:
                log.warning("warm resume: could not save %s's KV in %s: %s", session_id, self.directory, exc)
            finally:
                with self._lock:
                    self._writing, self._writing_id = False, None
                    self._lock.notify_all()

    def write(self, session_id: str, tokens: list[int], state: bytes) -> int:
        """Write one state now (the writer thread's job); returns the file's size (0: over budget)."""
        t0 = time.perf_counter()
        packed = struct.pack(f"<{len(tokens)}i", *tokens)
        crc = zlib.crc32(state, zlib.crc32(packed))
        header = json.dumps({"session": session_id, "layout": self.layout, "n_tokens": len(tokens),
                             "state_bytes": len(state), "crc32": crc, "saved": time.time()}).encode()
        size = len(MAGIC) + 4 + len(header) + len(packed) + len(state)
        path = self.path_for(session_id)
        if size > self.budget_bytes:
            log.warning("warm resume: %s's KV (%d MB) is over the disk budget (%d MB); not saved",
                        session_id, size >> 20, self.budget_bytes >> 20)
            path.unlink(missing_ok=True)  # an older, shorter state would no longer be the latest
            return 0
        tmp = path.with_suffix(TMP_SUFFIX)
        try:
            with open(tmp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(header)) + header)
                f.write(packed)
                f.write(state)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk keeps no half-written state taking room
            raise
        self.num_written += 1
        self._enforce_budget(keep=path)
        self.last_write_ms = (time.perf_counter() - t0) * 1000.0
        return size

    def _enforce_budget(self, keep: Path) -> None:
        files = [(p, _mtime(p), _size(p)) for p in self.files()]
        total = sum(size for _, _, size in files)
        for path, _, size in sorted(files, key=lambda f: f[1]):
            if total <= self.budget_bytes:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            total -= size
            self.num_evicted += 1
            log.info("warm resume: dropped %s to keep saved KV within %d MB", path.name, self.budget_bytes >> 20)

    # ---- loading ------------------------------------------------------------------------------

    def load(self, session_id: str) -> Lookup:
        """The conversation's state saved under this store's layout, checked end to end."""
        with self._lock:
            pending = self._pending.get(session_id)
        if pending is not None:  # saved a moment ago, not on disk yet
            tokens, state = pending
            return Lookup(Found.STATE, SavedState(session_id, list(tokens), bytearray(state), 0))
        path = self.path_for(session_id)
        if not path.exists():
            others = self._files_of(session_id)
            if others:
                return Lookup(Found.OTHER_LAYOUT, detail=f"saved under another model, build or KV "
                              f"settings ({_read_layout(others[0])}); this engine runs {self.layout}")
            return Lookup(Found.NOTHING, detail="no saved KV for this conversation")
        try:
            saved = self._read(path, session_id)
        except FileNotFoundError:  # the budget dropped it a moment ago
            return Lookup(Found.NOTHING, detail="no saved KV for this conversation")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
            why = _remove(path)  # a read-only directory keeps it: never a reason to fail the engine
            return Lookup(Found.DAMAGED, detail=f"{path.name} is damaged ({exc}); "
                          + ("deleted" if why is None else f"could not delete it ({why})"))
        try:
            os.utime(path)  # least recently used goes first: a load counts as a use
        except OSError:
            pass  # dropped by the budget meanwhile: the state in hand is still good
        return Lookup(Found.STATE, saved)

    def _read(self, path: Path, session_id: str) -> SavedState:
        size = path.stat().st_size
        data = bytearray(size)
        with open(path, "rb") as f:
            if f.readinto(data) != size:
                raise ValueError("short read")
        if not data.startswith(MAGIC):
            raise ValueError("not a saved KV file")
        at = len(MAGIC)
        (n_header,) = struct.unpack_from("<I", data, at)
        at += 4
        header = json.loads(bytes(data[at:at + n_header]))
        at += n_header
        if header.get("layout") != self.layout or header.get("session") != session_id:
            raise ValueError("its header names another layout or conversation")
        n_tokens, n_state = int(header["n_tokens"]), int(header["state_bytes"])
        if at + 4 * n_tokens + n_state != size:
            raise ValueError(f"{size} bytes where the header promises {at + 4 * n_tokens + n_state}")
        packed = memoryview(data)[at:at + 4 * n_tokens]
        state = memoryview(data)[at + 4 * n_tokens:]
        if zlib.crc32(state, zlib.crc32(packed)) != header["crc32"]:
            raise ValueError("checksum mismatch")
        tokens = list(struct.unpack_from(f"<{n_tokens}i", data, at))
        del packed, state
        del data[:at + 4 * n_tokens]  # the state alone, without another copy
        return SavedState(session_id, tokens, data, size)

    def discard(self, session_id: str) -> None:
        """Forget a conversation's saved KV under every layout (it was deleted)."""
        with self._lock:
            self._pending.pop(session_id, None)
            # A write of it under way would put the file back after the deletion: let it land.
            while self._writing_id == session_id:
                self._lock.wait()
        discard_saved(self.directory, session_id)


def discard_saved(directory: Path | str, session_id: str) -> None:
    """Delete a conversation's saved KV files (every layout); the app calls it when the
    conversation itself is deleted, since the tokens in them are its text."""
    # With the half-written temporary a writer killed mid-write left (same tokens, same text).
    for path in [*Path(directory).glob(f"{_digest(session_id, 20)}.*{SUFFIX}"),
                 *Path(directory).glob(f"{_digest(session_id, 20)}.*{TMP_SUFFIX}")]:
        why = _remove(path)
        if why is not None:  # a read-only directory: the engine (or the app) goes on regardless
            log.warning("warm resume: could not delete %s's saved KV %s: %s", session_id, path, why)


def _remove_stale_temporaries(directory: Path) -> None:
    """Delete what a writer killed mid-write left (a `.tmp` beside the states): outside the budget
    it would take room for good, and its tokens are a conversation's text. Only old ones go: a
    write takes seconds, so one younger than STALE_TMP_S may belong to a writer still running."""
    now = time.time()
    for path in directory.glob(f"*{TMP_SUFFIX}"):
        if now - _mtime(path) > STALE_TMP_S:
            _remove(path)


def _remove(path: Path) -> str | None:
    """Delete a file; None when it is gone, else why it could not be."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _read_layout(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + 4)
            (n,) = struct.unpack_from("<I", head, len(MAGIC))
            return str(json.loads(f.read(n)).get("layout", "?"))
    except (OSError, ValueError, struct.error):
        return "unreadable"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
