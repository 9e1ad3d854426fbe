"""Provides the agent trace of `bench agents`: seeded, pure data (JSON), replayed the same on every side."""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# Where the traces for the default sizes live (generated once, kept in the repo: a trace is data).
TRACES_DIR = Path(__file__).with_name("traces")
# Text of source code runs about this many characters per token on the default model's tokenizer;
# K (a tool result's size) is drawn in tokens and stored as characters (the replay reports the
# tokens each side actually evaluated, so this only sizes the draw).
CHARS_PER_TOKEN = 3.5
# What one agent's history may grow to (estimated tokens): below the default model's 8,192
# training context with room for the last reply, as an agent that compacts its history keeps it.
HISTORY_BUDGET = 7000
# The repository files the tool results are cut from, read when the trace is generated.
SOURCES = ("scheduler/admission.py", "scheduler/residency.py", "scheduler/planner.py", "scheduler/sequence.py",
           "magnitude_tui/engine/core.py", "magnitude_tui/serve/completion.py", "backend/llama_backend.py",
           "magnitude_bench/common.py")
SUBTASKS = ("List every function in {path} that touches the KV cache, one line each.",
            "Find where {path} handles a cancelled request and say what it frees.",
            "Check whether {path} has a test for the empty case; answer yes or no and why.",
            "Summarise what {path} exports, in three short bullet points.",
            "Name the class in {path} with the most methods and what it is for.",
            "Say which error paths in {path} log and which raise, in two sentences.")
TASKS = ("Fix the off-by-one in the prefix reuse of {path}.", "Add a docstring to every public function of {path}.",
         "Explain why {path} holds a lock around its queue.", "Make the slow path of {path} faster without changing it.",
         "Rename the confusing variables in {path}.", "Find the dead code in {path} and propose removing it.")


@dataclass(frozen=True)
class Subtask:
    """One subagent of a burst: its own task after its parent's context, and its short reply."""

    task: str
    max_tokens: int


@dataclass(frozen=True)
class Turn:
    """One step of an agent: the tool it called on its last reply runs for `think_s`, its result is
    appended, and the agent asks for a reply of at most `max_tokens`. A `read_file` result is
    `chars` characters of `path` from `start`; a burst (`subtasks`) is subagents forked from the
    agent's context, their answers appended as the tool results."""

    think_s: float
    max_tokens: int
    path: str = ""
    start: int = 0
    chars: int = 0
    subtasks: tuple[Subtask, ...] = ()

    @property
    def is_burst(self) -> bool:
        return bool(self.subtasks)


@dataclass(frozen=True)
class AgentTrace:
    name: str
    system: str
    task: str
    first_max_tokens: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Trace:
    """M agents' turns and the file texts their reads are cut from (stored: the replay reads no
    repository file, so a trace means the same work after the code changes)."""

    seed: int
    bursts: bool
    k_range: tuple[int, int]
    think_range: tuple[float, float]
    files: dict[str, str]
    agents: tuple[AgentTrace, ...]

    def text(self, turn: Turn) -> str:
        return self.files[turn.path][turn.start:turn.start + turn.chars]

    def view(self, *, agents: int | None = None, turns: int | None = None, k_max: int | None = None,
             think_scale: float = 1.0) -> "Trace":
        """The first `agents` agents, their first `turns` turns, reads cut to `k_max` tokens and
        think times scaled: a smaller run of the same trace (a shared machine's configuration)."""
        cap = None if k_max is None else int(k_max * CHARS_PER_TOKEN)

        def turn(t: Turn) -> Turn:
            chars = t.chars if cap is None or t.is_burst else min(t.chars, cap)
            return replace(t, chars=chars, think_s=round(t.think_s * think_scale, 3))

        picked = tuple(replace(a, turns=tuple(turn(t) for t in a.turns[:turns])) for a in self.agents[:agents])
        return replace(self, agents=picked)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=0)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        d = json.loads(text)
        agents = tuple(AgentTrace(a["name"], a["system"], a["task"], a["first_max_tokens"],
                                  tuple(Turn(**{**t, "subtasks": tuple(Subtask(**s) for s in t["subtasks"])})
                                        for t in a["turns"]))
                       for a in d["agents"])
        return cls(d["seed"], d["bursts"], tuple(d["k_range"]), tuple(d["think_range"]), d["files"], agents)


def default_trace_path(bursts: bool) -> Path:
    return TRACES_DIR / ("agents-16x6-bursts.json" if bursts else "agents-16x6-no-bursts.json")


def load_trace(path: str | Path) -> Trace:
    return Trace.from_json(Path(path).read_text())


def read_sources(root: Path, paths: tuple[str, ...] = SOURCES, k_max: int = 3000) -> dict[str, str]:
    """The start of each source file, long enough for the largest read."""
    limit = int(k_max * CHARS_PER_TOKEN) + 1
    return {p: (root / p).read_text()[:limit] for p in paths}


def generate(files: dict[str, str], *, seed: int = 23, agents: int = 16, turns: int = 6, bursts: bool = True,
             k_range: tuple[int, int] = (100, 3000), reply_range: tuple[int, int] = (40, 150),
             think_range: tuple[float, float] = (0.0, 2.0), burst_width: tuple[int, int] = (3, 6),
             burst_p: float = 0.2) -> Trace:
    """A seeded trace. Agent i draws from its own generator (seed, i), so the first M agents of a
    16-agent trace are the M-agent trace. With `bursts`, each agent spawns subagents once at turn
    1 or 2 and then at any later turn with probability `burst_p`; without, those turns are reads."""
    paths = sorted(files)
    out = []
    for i in range(agents):
        rng = random.Random(f"{seed}-{i}")
        first = rng.choice(paths)
        system = (f"You are agent {i}, a coding assistant working in a Python repository with tools. "
                  "Read files with read_file, delegate independent questions to subagents with "
                  "spawn_subagents, and answer briefly: one or two sentences per step, no code unless asked. "
                  "Keep track of what you already read and do not read a file twice.")
        task = rng.choice(TASKS).format(path=first)
        used = (len(system) + len(task)) / CHARS_PER_TOKEN + 20
        burst_at = rng.randint(1, 2)
        steps = []
        for t in range(turns):
            # Every draw is made whether or not it is used, so the traces with and without bursts
            # hold the same reads wherever neither one spawns.
            reply, think = rng.randint(*reply_range), round(rng.uniform(*think_range), 3)
            spawn = t > 0 and (rng.random() < burst_p or t == burst_at)
            n = rng.randint(*burst_width)
            # Distinct questions within a burst (two identical subagents would be one).
            asks = rng.sample([(q, p) for q in SUBTASKS for p in paths], burst_width[1])
            subs = tuple(Subtask(q.format(path=p), rng.randint(*reply_range)) for q, p in asks)[:n]
            k, path, where = rng.randint(*k_range), rng.choice(paths), rng.random()
            if bursts and spawn:
                cost = sum(s.max_tokens + 40 for s in subs) + reply
                if used + cost > HISTORY_BUDGET:
                    break
                steps.append(Turn(think_s=0.0, max_tokens=reply, subtasks=subs))
                used += cost
                continue
            room = HISTORY_BUDGET - used - reply - 40
            if room < k_range[0]:
                break
            chars = min(int(min(k, room) * CHARS_PER_TOKEN), len(files[path]))
            start = int(where * (len(files[path]) - chars))
            steps.append(Turn(think_s=think, max_tokens=reply, path=path, start=start, chars=chars))
            used += chars / CHARS_PER_TOKEN + reply + 40
        out.append(AgentTrace(f"agent-{i}", system, task, rng.randint(*reply_range), tuple(steps)))
    return Trace(seed, bursts, k_range, think_range, files, tuple(out))


def write_default_traces(root: Path, out_dir: Path = TRACES_DIR) -> list[Path]:
    """Regenerate the traces kept in the repository (16 agents, 6 turns, with and without bursts)."""
    files = read_sources(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for bursts in (True, False):
        path = out_dir / default_trace_path(bursts).name
        path.write_text(generate(files, bursts=bursts).to_json())
        written.append(path)
    return written
