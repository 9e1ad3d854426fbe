"""mypy finds no error in the packages (pyproject.toml's [tool.mypy]), and the seams' implementations
satisfy their protocols statically (tests/protocol_checks.py), in CI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_nothing():
    # The cache (.mypy_cache, git-ignored) makes a run after a small change take seconds.
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
