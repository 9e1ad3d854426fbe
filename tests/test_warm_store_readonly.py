"""Warm resume on a data directory that cannot be written (a read-only mount): a damaged state
or a deleted conversation's state that cannot be removed leaves the engine running; the restore
starts cold and says why. Simulated by an unlink that fails (root ignores permission bits)."""

from __future__ import annotations

import pathlib

from magnitude_tui.engine.events import ForgetSession, RestoreOutcome, RestoreSession, SessionRestored
from magnitude_tui.engine.warm_store import discard_saved
from tests.test_warm_resume import _engine, _first_exchange, _idle_save


def _read_only(monkeypatch) -> None:
    def unlink(self, missing_ok=False):
        raise PermissionError(30, "Read-only file system", str(self))

    monkeypatch.setattr(pathlib.Path, "unlink", unlink)


def _saved(tmp_path):
    engine, clock = _engine(tmp_path)
    conversation = _first_exchange(engine)
    _idle_save(engine, clock)
    engine.warm.store.flush()
    (path,) = engine.warm.store.files()
    return conversation, path


def test_damaged_state_in_read_only_dir_starts_cold_and_engine_runs(tmp_path, monkeypatch):
    conversation, path = _saved(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])  # truncated
    engine, _ = _engine(tmp_path)
    _read_only(monkeypatch)
    engine.apply(RestoreSession("s1", tuple(conversation)))
    engine.step()  # raised PermissionError out of the engine's step before
    (notice,) = [n for n in engine.take_notices() if isinstance(n, SessionRestored)]
    assert notice.outcome is RestoreOutcome.CORRUPT
    assert "could not delete" in notice.detail and "Read-only" in notice.detail
    assert path.exists()


def test_forget_in_read_only_dir_does_not_fail_the_engine(tmp_path, monkeypatch):
    _, path = _saved(tmp_path)
    engine, _ = _engine(tmp_path)
    _read_only(monkeypatch)
    engine.apply(ForgetSession("s1"))
    engine.step()  # raised PermissionError before
    discard_saved(tmp_path / "kv", "s1")  # the app's own deletion (no engine running) too
    assert path.exists()
