"""The app side of issue 27's faults: an unusable warm-resume directory, two apps on one store, a
directory as the database, a GGUF whose tensor claims 4 billion dimensions."""

from __future__ import annotations

import struct
import subprocess
import sys
import time

import pytest

from backend.factory import BackendConfig
from backend.model_file import ModelFileError, check_gguf
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import EngineConfig
from magnitude_tui.engine.waiting import wait_ready
from magnitude_tui.store import Store, StoreError


def test_an_unusable_warm_resume_directory_leaves_the_engine_running_without_it(tmp_path):
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data directory should be")  # mkdir under it fails, even as root
    client = WorkerClient(EngineConfig(BackendConfig("fake"), warm_dir=str(blocker / "kv"), warm_budget_mb=64),
                          in_process=True, log_path=None)
    client.start()
    try:
        ready = wait_ready(client, 30)
        assert ready.info.warm_resume.startswith(f"off: cannot use {blocker / 'kv'}")
    finally:
        client.stop()


HOLDER = """
import sys
from magnitude_tui.store import Store
store = Store(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
"""


def test_a_second_app_on_the_same_store_is_refused_until_the_first_quits(tmp_path):
    path = tmp_path / "magnitude.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StoreError, match=rf"another magnitude-tui \(pid {holder.pid}\) is using"):
            Store(path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    first = Store(path)
    again = Store(path)  # the same process may open it again (resume, tests)
    first.close()
    again.close()
    assert Store(path).read_only is None


def test_a_directory_as_the_database_path_is_one_clear_error(tmp_path):
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def _gguf_with_dims(path, n_dims: int, padding: int) -> None:
    name = b"token_embd.weight"
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims)
    path.write_bytes(head + b"\0" * padding)


def test_a_tensor_with_four_billion_dimensions_is_refused_at_once_as_corrupt(tmp_path):
    path = tmp_path / "crafted.gguf"
    _gguf_with_dims(path, 0xFFFFFFFF, 16 * 2**20)
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match="corrupt GGUF header.*4,294,967,295 dimensions"):
        check_gguf(str(path))
    assert time.perf_counter() - t0 < 0.5
