"""The typed seams: one policy parser everywhere, subagent limits from the pane limit, KV-relief
verdicts as enums, a backend that names everything the engine reads, and a bench package that
imports without cycles or private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from backend.factory import BackendConfig, build_backend
from backend.protocol import Backend
from magnitude_tui.commands import parse_slash
from magnitude_tui.screens.policy_dialog import policy_problem
from magnitude_tui.widgets.pane_grid import MAX_PANES, MAX_SUBAGENTS
from magnitude_tui.widgets.scheduler_panel import policy_target_ms
from scheduler.budget import PolicyKind, parse_policy
from scheduler.relief import KvRelief, Remedy
from scheduler.sequence import Sequence
from scheduler.types import BatchPlan, Message, Request, SeqSlice

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("policy", ["target:0", "target:-5", "fixed:0", "target:nan", "fifo"])
def test_the_dialog_and_the_slash_command_reject_what_the_engine_rejects(policy):
    assert policy_problem(policy) is not None
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        parse_slash(f"/policy {policy}")


@pytest.mark.parametrize("policy", ["target:0.5", "fixed:16", "prefill-first", "TARGET:40"])
def test_every_policy_the_engine_takes_is_accepted(policy):
    assert policy_problem(policy) is None
    assert parse_slash(f"/policy {policy}").arg == policy


def test_subagent_limits_follow_from_the_pane_limit():
    assert MAX_SUBAGENTS == MAX_PANES - 1
    assert parse_slash(f"/spawn {MAX_SUBAGENTS} go").count == MAX_SUBAGENTS
    with pytest.raises(ValueError, match=f"between 1 and {MAX_SUBAGENTS}"):
        parse_slash(f"/spawn {MAX_PANES} go")
    with pytest.raises(ValueError, match=f"between 1 and {MAX_SUBAGENTS}"):
        parse_slash(f"/burst {MAX_PANES}")


def _seq(rid: str, order: int) -> Sequence:
    seq = Sequence(Request(rid, rid, (Message("user", "x"),)), [1, 2, 3], t_submit=0.0)
    seq.admit_order = order
    return seq


def test_kv_relief_verdicts_are_enums_in_their_order_of_preference():
    relief = KvRelief(n_batch=64)
    wide = BatchPlan(1, (SeqSlice(0, 0, (1,) * 8, True, False),), 8)
    narrow = BatchPlan(2, (SeqSlice(0, 0, (1,), True, True),), 1)
    a, b = _seq("a", 0), _seq("b", 1)
    assert relief.on_no_kv_slot(wide, [a, b], lambda: True).remedy is Remedy.SMALLER
    assert relief.cap(100) == 4
    assert relief.on_no_kv_slot(narrow, [a, b], lambda: True).remedy is Remedy.EVICTED
    verdict = relief.on_no_kv_slot(narrow, [a, b], lambda: False)
    assert verdict.remedy is Remedy.PREEMPT and verdict.seq is b  # the most recently admitted
    relief = KvRelief(n_batch=64)
    assert relief.on_no_kv_slot(narrow, [a], lambda: False).remedy is Remedy.WAIT
    relief.on_no_kv_slot(narrow, [a], lambda: False)
    verdict = relief.on_no_kv_slot(narrow, [a], lambda: False)
    assert verdict.remedy is Remedy.GIVE_UP and verdict.seq is a


@pytest.mark.parametrize("kind", ["fake", "simulated:cpu2core"])
def test_a_backend_names_everything_the_engine_reads(kind):
    backend = build_backend(BackendConfig(kind, n_ctx=1024))
    for name in Backend.__annotations__:
        assert hasattr(backend, name), name
    assert backend.n_ctx_seq == backend.n_ctx == 1024
    assert callable(backend.clock) and callable(backend.clock.sleep)
    assert (backend.known_costs is None) == (kind == "fake")


def _sources(*globs: str) -> list[tuple[str, ast.AST]]:
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text()))
            for pattern in globs for path in sorted(ROOT.glob(pattern))]


# Everything that reads a backend: the engine, the worker, the backends' own helpers, the bench
# and the commands that build one.
BACKEND_READERS = ("backend/*.py", "magnitude_tui/engine/*.py", "magnitude_bench/*.py", "magnitude_tui/cli*.py",
                   "magnitude_tui/generate.py", "magnitude_tui/app.py")


def test_nothing_reads_a_backend_by_getattr():
    """A named attribute is read as one (the protocol names it); getattr/hasattr on a backend
    would hide a missing attribute behind a default. Delegating every name (a wrapper's
    __getattr__) is not a probe."""
    probes = []
    for path, tree in _sources(*BACKEND_READERS):
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                    and "backend" in ast.unparse(node.args[0]).lower()
                    and (node.func.id == "hasattr" or isinstance(node.args[1], ast.Constant))):
                probes.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, probes


def _is_text(node: ast.AST) -> bool:
    """A string literal, or a tuple/list/set of them (`x in ("a", "b")`)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_text(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def test_decode_outcomes_and_verdicts_are_never_compared_as_text():
    found = []
    for path, tree in _sources("backend/*.py", "scheduler/*.py", "magnitude_tui/**/*.py"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                text = " ".join(ast.unparse(x) for x in sides if not _is_text(x)).lower()
                if any(_is_text(x) for x in sides) and any(word in text for word in ("outcome", "remedy")):
                    found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


@pytest.mark.parametrize("text, kind, target", [("prefill-first", PolicyKind.PREFILL_FIRST, None),
                                                ("fixed:16", PolicyKind.FIXED, None),
                                                ("TARGET:40", PolicyKind.TARGET, 40.0),
                                                ("target-v1:50", PolicyKind.TARGET_V1, 50.0)])
def test_a_parsed_policy_names_its_kind_as_an_enum(text, kind, target):
    policy = parse_policy(text)
    assert policy.kind is kind and policy.target_ms == target
    assert parse_policy(str(policy)) == policy
    assert policy_target_ms(text) == target


def test_backends_are_built_only_by_the_factory():
    """The app, the worker, generate and the bench build through build_backend; only the soak's
    fault-injecting stand-ins (a FakeBackend with `eog_after`, as the tests build them) do not."""
    built = []
    for path, tree in _sources("magnitude_tui/**/*.py"):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            call = ast.unparse(node.func)
            if call in ("LlamaBackend", "LlamaBackend.load", "SimulatedBackend") or \
                    (call == "FakeBackend" and path != "magnitude_tui/reliability/engine.py"):
                built.append(f"{path}:{node.lineno}: {call}(...)")
    assert not built, built


def _bench_imports() -> dict[str, set[str]]:
    """Each bench module -> the bench modules it imports, at any depth of its code (an import
    inside a function is still an edge: it only moves the cycle to run time)."""
    graph: dict[str, set[str]] = {}
    for path, tree in _sources("magnitude_bench/*.py"):
        name = "magnitude_bench" + ("" if path.endswith("__init__.py") else "." + Path(path).stem)
        edges = graph.setdefault(name, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    module = "magnitude_bench" if node.level == 1 else "magnitude_tui"
                    module += f".{node.module}" if node.module else ""
                if module == "magnitude_bench":
                    edges.update(f"magnitude_bench.{a.name}" for a in node.names)
                elif module.startswith("magnitude_bench."):
                    edges.add(module)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("magnitude_bench."))
        edges.discard(name)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_bench_package_has_no_import_cycle_and_no_private_imports():
    # bench.ui is importable on its own, without the CLI that registers its command.
    code = "import sys, magnitude_bench.ui; assert 'magnitude_bench.cli' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    graph = _bench_imports()
    assert "magnitude_bench.soak_perf" in graph["magnitude_bench.soak"]  # the graph sees lazy imports
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"
    private = []
    for path, tree in _sources("magnitude_bench/*.py"):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in
                                                     ("magnitude_tui", "backend", "scheduler", "themes")):
                private += [f"{path}: {a.name} from {node.module}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, private


# ---- the app's seams: the workspace model, the event pump ------------------------------------


def _app_imports() -> dict[str, set[str]]:
    """Each app module -> the app modules it imports when it runs: at any depth of its code (a
    lazy import only moves a cycle to run time), but not under `if TYPE_CHECKING:`."""
    graph: dict[str, set[str]] = {}
    for path, tree in _sources("magnitude_tui/**/*.py"):
        parts = Path(path).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        edges = graph.setdefault(name, set())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                       for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("magnitude_tui"):
                module = node.module or ""
                edges.update(f"{module}.{a.name}" if f"{module}.{a.name}".replace(".", "/") + ".py"
                             in _APP_FILES else module for a in node.names)
            elif isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.startswith("magnitude_tui"))
        edges.discard(name)
    return graph


_APP_FILES = {str(p.relative_to(ROOT)) for p in ROOT.glob("magnitude_tui/**/*.py")}


def test_the_app_has_no_import_cycle_with_its_workspace_helpers():
    graph = _app_imports()
    for helper in ("magnitude_tui.workspace.model", "magnitude_tui.workspace.turns",
                   "magnitude_tui.workspace.conversations", "magnitude_tui.workspace.pump",
                   "magnitude_tui.subagents", "magnitude_tui.screens.engine_link"):
        assert helper in graph, helper
    assert "magnitude_tui.workspace.model" in graph["magnitude_tui.screens.workspace"]
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_workspace_model_runs_without_textual():
    """The model, its turns, conversations and subagents, and the pump import no Textual: they are
    driven by their host protocols and can be tested (and reused) without a screen."""
    code = ("import sys; import magnitude_tui.workspace.model, magnitude_tui.workspace.pump; "
            "assert 'textual' not in sys.modules, [m for m in sys.modules if m.startswith('textual')][:5]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_workspace_model_reaches_its_screen_only_through_its_host():
    """No module of the model names the screen or a widget at run time (annotations only)."""
    graph = _app_imports()
    for module in ("magnitude_tui.workspace.model", "magnitude_tui.workspace.turns",
                   "magnitude_tui.workspace.conversations", "magnitude_tui.subagents"):
        ui = sorted(m for m in graph[module] if m.startswith(("magnitude_tui.screens", "magnitude_tui.widgets")))
        assert not ui, (module, ui)


def _project_frames(stack) -> list[str]:
    """The repository's own files on a stack, outermost first (Textual's and asyncio's left out)."""
    files = []
    for frame in stack:
        path = Path(frame.filename)
        if path.is_absolute() and ROOT in path.parents and ".venv" not in path.parts and "tests" not in path.relative_to(ROOT).parts:
            files.append(str(path.relative_to(ROOT)))
    return files


def _source_of(function) -> str:
    import inspect

    return str(Path(inspect.getsourcefile(function)).relative_to(ROOT))


async def test_enter_reaches_the_decode_through_at_most_ten_files_and_never_back_into_the_screen(tmp_path):
    """Enter in a composer, followed to the backend's decode: the files on the stack at each hop
    (the composer's message, the pane's message, the client's submit, and on the engine thread
    the decode) are at most ten in all, and once the screen handed the turn to the workspace
    model nothing calls back into a screen or a widget."""
    import traceback

    from backend.fake import FakeBackend
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.store import Store
    from magnitude_tui.widgets.chat_pane import ChatPane
    from magnitude_tui.widgets.composer import Composer
    from scheduler.types import SamplingParams
    from tests.app_support import SIZE, wait_for

    hops: dict[str, list[str]] = {}

    def record(hop: str) -> None:
        hops.setdefault(hop, _project_frames(traceback.extract_stack()[:-2]))

    def spy(cls, hop, wanted):
        original = cls.post_message

        def post_message(self, message):
            if isinstance(message, wanted):
                record(hop)
            return original(self, message)
        return post_message

    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=4096)), in_process=True)
    decode = FakeBackend.decode

    def decode_spy(self, plan):
        if "submit" in hops and "decode" not in hops:
            record("decode")
            hops["decode"].append(_source_of(decode))  # the decode itself, which this spy calls
        return decode(self, plan)

    submit = client.submit

    def submit_spy(request):
        record("submit")
        hops["submit"].append(_source_of(WorkerClient.submit))  # the submit itself, which this spy calls
        return submit(request)

    client.submit = submit_spy
    app = MagnitudeApp(client=client, store=Store(tmp_path / "m.db"), export_dir=tmp_path,
                       sampling=SamplingParams(max_tokens=4))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeBackend, "decode", decode_spy)
        mp.setattr(Composer, "post_message", spy(Composer, "composer", Composer.Submitted))
        mp.setattr(ChatPane, "post_message", spy(ChatPane, "pane", ChatPane.Submitted))
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.workspace.engine_ready, what="the engine")
            await pilot.press(*"hi", "enter")
            await wait_for(pilot, lambda: "decode" in hops, what="the decode")
    files = {f for stack in hops.values() for f in stack}
    assert len(files) <= 10, sorted(files)
    submit_stack = hops["submit"]
    assert submit_stack[0] == "magnitude_tui/screens/workspace.py", submit_stack  # the screen's handler
    after = submit_stack[submit_stack.index("magnitude_tui/workspace/turns.py"):]
    assert not [f for f in after if f.startswith(("magnitude_tui/screens/", "magnitude_tui/widgets/"))], after
    assert hops["decode"][-1] == "backend/fake.py" and "magnitude_tui/engine/worker.py" in hops["decode"]


async def test_a_serve_reply_completes_while_the_workspace_screen_is_blocked(tmp_path):
    """Under --serve the app's pump hands each batch to the serve hub itself: an HTTP reply is
    answered while the workspace screen handles nothing (its message loop held in a handler), and
    the screen catches up afterwards from its inbox."""
    import asyncio

    import httpx

    from backend.fake import DEFAULT_REPLY
    from magnitude_tui.app import MagnitudeApp
    from magnitude_tui.engine.client import WorkerClient
    from magnitude_tui.engine.events import EngineConfig
    from magnitude_tui.serve.app import ServeOptions
    from magnitude_tui.serve.server import EmbeddedServer
    from magnitude_tui.store import Store
    from scheduler.types import SamplingParams
    from tests.app_support import SIZE, wait_for
    from tests.serve_support import free_port

    client = WorkerClient(EngineConfig(BackendConfig("fake", n_ctx=16384, n_seq_max=8)), in_process=True)
    port = free_port()
    serve = EmbeddedServer(client, host="127.0.0.1", port=port, options=ServeOptions(model_name="fake"))
    app = MagnitudeApp(client=client, store=Store(tmp_path / "m.db"), export_dir=tmp_path,
                       sampling=SamplingParams(max_tokens=30), serve=serve)
    async with app.run_test(size=SIZE) as pilot:
        ws = app.workspace
        await wait_for(pilot, lambda: ws.engine_ready, what="the engine")
        blocked, release = asyncio.Event(), asyncio.Event()

        async def hold_the_screen() -> None:
            blocked.set()
            await release.wait()

        ws.call_later(hold_the_screen)
        await asyncio.wait_for(blocked.wait(), 10)
        applied = ws.link.batches_applied
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) as http:
                r = await http.post("/chat/completions", json={
                    "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12, "user": "coder"})
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY[:12]
            assert ws.link.batches_applied == applied  # the screen took nothing meanwhile...
            assert ws.link.inbox.num_waiting > 0  # ...its batches wait for it
        finally:
            release.set()
        api = lambda: [p for p in ws.grid.panes if p.record.role == "api"]  # noqa: E731
        await wait_for(pilot, lambda: api() and len(api()[0].record.messages) == 2
                       and not api()[0].busy, what="the pane to catch up")
        assert api()[0].record.messages[-1].content == DEFAULT_REPLY[:12]
