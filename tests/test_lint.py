"""The code passes ruff's pyflakes checks (unused imports and variables, undefined names), in CI."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    done = subprocess.run([ruff, "check", "--no-cache", "backend", "scheduler", "magnitude_tui", "themes", "tests",
                           "scripts"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
