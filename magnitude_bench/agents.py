"""Provides `bench agents`: one agent trace replayed against serve, the engine and llama-server, alternating and repeated."""

from __future__ import annotations

import asyncio
import os
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass

from magnitude_bench.agents_replay import CallKind, CallRecord, Replay, replay
from magnitude_bench.agents_report import summary, tables
from magnitude_bench.agents_sides import SIDES, SideSetup, SideSpec, open_side
from magnitude_bench.agents_trace import Trace, default_trace_path, load_trace
from magnitude_bench.common import BenchResult, load_avg, watched
from magnitude_bench.harness import alternating, recorded


@dataclass(frozen=True)
class AgentsConfig:
    trace: str | None = None  # a trace file; None: the repository's (with and without bursts)
    bursts: tuple[bool, ...] = (True, False)  # which default traces (ignored with `trace`)
    # The view of the trace that runs: its first agents and turns, reads cut to k_max tokens (a
    # shared 2-core machine cannot replay 16 agents' 3,000-token reads many times over).
    agents: int = 4
    turns: int | None = 3
    k_max: int | None = 600
    think_scale: float = 1.0
    sides: tuple[str, ...] = tuple(s for s in SIDES if not (SIDES[s].serve_prompts or SIDES[s].flash_attn or SIDES[s].spec
                                                                      or SIDES[s].kv_streams))
    reps: int = 2
    threads: int = 1
    n_ctx: int = 16384
    parallel: int = 0  # llama-server -np and the engine's sequences; 0: agents + the widest burst
    backend: str = "llama"  # "fake": a model-free smoke run (tests)
    model: str | None = None
    in_process: bool = False  # the engine in a thread of this process (tests)
    exact_replies: bool = False  # every reply runs to its max_tokens on every side (ignore_eos)
    # Two sides at once, each on a core of its own (swapped every repetition): both see the same
    # moments of a machine whose speed drifts, where sides run one after another do not.
    paired: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.sides if s not in SIDES]
        if unknown:
            raise ValueError(f"unknown side {unknown[0]!r}: use {', '.join(SIDES)}")
        if self.paired and len(self.sides) != 2:
            raise ValueError(f"paired runs take exactly two sides, not {len(self.sides)}")


def traces(cfg: AgentsConfig) -> list[tuple[bool, Trace]]:
    """The traces a run replays, as viewed by cfg."""
    if cfg.trace is not None:
        found = [load_trace(cfg.trace)]
    else:
        found = [load_trace(default_trace_path(b)) for b in cfg.bursts]
    viewed = [t.view(agents=cfg.agents, turns=cfg.turns, k_max=cfg.k_max, think_scale=cfg.think_scale)
              for t in found]
    return [(any(turn.is_burst for a in t.agents for turn in a.turns), t) for t in viewed]


async def _drive(side, trace: Trace, tag: str) -> Replay:
    async with side.session():
        # First-call costs (a server's lazy setup), on a prompt no agent shares a prefix with.
        warm = CallRecord(0, 0, f"{tag}-warmup", CallKind.TURN, 0, None)
        await side.call(warm, [{"role": "user", "content": "Say hello."}], 4)
        return await replay(trace, side, tag=tag)


def run_one(spec: SideSpec, setup: SideSetup, trace: Trace, tag: str) -> dict:
    """A fresh side (nothing cached from another run), the trace replayed on it once."""
    load_before = load_avg()
    with open_side(spec, setup) as side:
        out, others = watched(lambda: asyncio.run(_drive(side, trace, tag)), side.pids)  # the server is ours
        return _row(spec, side, out, others, load_before)


def _row(spec: SideSpec, side, out, others: float, load_before) -> dict:
    return {"side": spec.label, **summary(out), "others_cores": round(others, 2), "load_before": load_before,
            "load_after": load_avg(), "server_cmd": getattr(side, "cmd", None), "attention": side.attention(),
            "kv": out.kv, "call_log": [{**{k: v for k, v in asdict(c).items() if k != "text"}, "kind": c.kind.value,
                                        "reply_chars": len(c.text)} for c in out.calls]}


def threads(pid: int) -> set[int]:
    return set(map(int, os.listdir(f"/proc/{pid}/task")))


def pin(tids: set[int], cores: set[int]) -> None:
    """These threads onto `cores` (threads they start later inherit it)."""
    for tid in tids:
        with suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cores)


def run_pair(specs: tuple[SideSpec, SideSpec], setup: SideSetup, trace: Trace, tag: str, rep: int) -> list[dict]:
    """Two fresh sides replaying the trace at the same time, each pinned to a core of its own; the
    cores swap every repetition. A side's processes go on its core, and so do the threads it
    started in this process (serve's HTTP server, event pump and worker pipes; a server's log
    reader); the client of both sides (this thread) alone runs on either core."""
    mine, me = os.sched_getaffinity(0), os.getpid()
    if len(mine) < 2:
        raise RuntimeError(f"paired runs need two cores; this process may use {len(mine)}")
    cores = sorted(mine)[:2]
    if rep % 2:
        cores.reverse()
    load_before = load_avg()
    with ExitStack() as stack:
        sides, started = [], []
        for spec in specs:
            before = threads(me)
            sides.append(stack.enter_context(open_side(spec, setup)))
            started.append(threads(me) - before)
        try:
            for side, own, core in zip(sides, started, cores):
                pin(own | {t for pid in side.pids for t in threads(pid)}, {core})

            async def both():
                return await asyncio.gather(*(_drive(side, trace, tag) for side in sides))

            outs, others = watched(lambda: asyncio.run(both()), tuple(p for side in sides for p in side.pids))
        finally:
            pin(threads(me), mine)
        return [{**_row(spec, side, out, others, load_before), "core": core, "paired_with": other.label}
                for spec, side, out, core, other in zip(specs, sides, outs, cores, reversed(specs))]


@recorded
def run_agents(cfg: AgentsConfig, progress=lambda s: None) -> BenchResult:
    result = BenchResult("agents", "bench agents: an agent trace against serve, the engine and llama-server",
                         config={"agents": asdict(cfg), "trace_files": [cfg.trace] if cfg.trace else
                                 [str(default_trace_path(b)) for b in cfg.bursts]})
    runs: list[dict] = []
    for bursts, trace in traces(cfg):
        widest = max((len(t.subtasks) for a in trace.agents for t in a.turns), default=0)
        setup = SideSetup(cfg.backend, cfg.model, cfg.threads, cfg.n_ctx, cfg.parallel or len(trace.agents) + widest,
                          cfg.in_process, exact_replies=cfg.exact_replies)
        result.config.setdefault("setups", []).append({"bursts": bursts, **asdict(setup)})
        # One unit per repetition and side; paired, both sides of a repetition are one unit.
        units = ([(rep, tuple(cfg.sides)) for rep in range(cfg.reps)] if cfg.paired
                 else [(rep, (name,)) for rep, name in alternating(cfg.sides, cfg.reps)])
        for rep, names in units:
            who, tag = " and ".join(names), f"r{rep + 1}{'b' if bursts else 'n'}"
            progress(f"{'bursts' if bursts else 'no bursts'}, repetition {rep + 1} of {cfg.reps}: {who}"
                     + (" at once" if cfg.paired else ""))
            try:
                rows = (run_pair((SIDES[names[0]], SIDES[names[1]]), setup, trace, tag=tag, rep=rep) if cfg.paired
                        else [run_one(SIDES[names[0]], setup, trace, tag=tag)])
            except Exception as e:  # a side that cannot start is a note, not a lost benchmark
                result.notes.append(f"{who} (rep {rep + 1}) did not run: {type(e).__name__}: {e}")
                continue
            for row in rows:
                runs.append({"bursts": bursts, "rep": rep + 1, **row})
                where = f"  {row['side']} on core {row['core']}:" if cfg.paired else " "
                progress(f"{where} makespan {row['makespan_s']} s, TTFT p95 {row['ttft_p95_s']} s, evaluated "
                         f"{row['evaluated']} of minimum {row['minimum']}, others {row['others_cores']} cores")
    result.data["runs"] = runs
    tables(result, runs)
    paths = {r["side"]: r["attention"] for r in runs if r.get("attention")}
    if paths:
        result.notes.append("attention path per side: " + "; ".join(f"{side}: {path}" for side, path in paths.items()))
    result.notes += [
        "makespan: the first call to the last reply of the trace; TTFT: every call's send to its first "
        "streamed token, on the client (agents' turns and subagents')",
        "minimum: per call, its prompt tokens less the prompt + reply of the call it extends (the agent's "
        "previous call; a subagent's parent call): new tokens only; evaluated: what the side reported "
        "(serve: prompt - cached_tokens; llama-server: timings.prompt_n); reevaluated: evaluated beyond "
        "the minimum, summed per call (what its cache no longer held or never shared)",
        "serve and llama-server render the tool calls in the history with their own templates (llama-server's "
        "rendering of a template without tool support drops them), so their prompt tokens differ; each "
        "side's minimum is its own; 'llama-server on serve's prompts' is sent serve's rendering",
        "a call the server closed before answering is sent again, up to twice, as the openai client does "
        "(resent, per call in the JSON); the time lost counts in its TTFT",
        ("every reply runs to its max_tokens on every side (ignore_eos: the same tokens generated; an "
         "end-of-generation token kept in a reply is not in the history sent next, so the side evaluates "
         "the reply again from there, and reevaluated counts it)" if cfg.exact_replies else
         "replies stop on end-of-generation or max_tokens (greedy, the same model): generated shows "
         "how many tokens each side made"),
        "others_cores: cores other processes kept busy during the run (a shared machine); "
        "load_before/load_after per run are in the JSON",
    ]
    if cfg.paired:
        result.notes.append(
            "paired: both sides replay the trace at the same time, each pinned to a core of its own (core, "
            "per run; swapped every repetition), so each repetition's ratio compares the same minutes of the "
            "machine; the threads a side starts in this process (serve's HTTP server and event pump) share "
            "its core, the client of both sides runs on either core; others_cores counts neither side")
    return result
