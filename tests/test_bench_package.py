"""The benchmarks are their own package (magnitude_bench, the [bench] extra with matplotlib): the app,
serve and generate start in an interpreter where neither can be imported."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Run before anything else in the child: importing matplotlib or the bench package fails there.
BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('matplotlib', 'magnitude_bench'):
            raise ImportError('blocked in this test: ' + name)
        return None
sys.meta_path.insert(0, _Block())
"""


def _python(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_every_app_module_imports_without_the_bench_extra():
    code = """
import importlib, pkgutil, magnitude_tui, scheduler, backend
names = []
for pkg in (magnitude_tui, scheduler, backend):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):
        importlib.import_module(m.name)
        names.append(m.name)
assert 'magnitude_tui.serve.app' in names and 'magnitude_tui.generate' in names, names
assert not any(n.split('.')[0] in ('matplotlib', 'magnitude_bench') for n in sys.modules)
print(len(names))
"""
    r = _python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 100


@pytest.mark.slow
def test_generate_runs_without_the_bench_extra():
    code = "from magnitude_tui.cli import app; app()"
    r = _python(code, "generate", "What is the capital of France?", "--n", "2", "--max-tokens", "6",
                "--device", "cpu", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert len(out["sequences"]) == 2
    assert all(s["error"] is None and s["generated_tokens"] > 0 for s in out["sequences"])


def test_serve_starts_and_answers_without_the_bench_extra():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "from magnitude_tui.cli import app; app()"
    proc = subprocess.Popen([sys.executable, "-c", BLOCK + code, "serve", "--backend", "fake", "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, health = time.monotonic() + 60, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    health = json.loads(r.read())
                    break
            except OSError:
                time.sleep(0.3)
        assert health is not None, proc.stderr.read()[-3000:] if proc.poll() is not None else "no answer"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_old_bench_command_names_the_new_one():
    r = _python("from magnitude_tui.cli import app; app()", "bench", "throughput", "--seqs", "1")
    assert r.returncode == 2
    assert "magnitude-bench throughput --seqs 1" in r.stderr
    assert "magnitude-tui[bench]" in r.stderr
