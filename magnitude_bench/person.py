"""Provides `bench person`: a person's prompt TTFT beside N generating agents, with and without agents yielding."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from backend.factory import BackendConfig
from magnitude_bench.common import BenchResult, backend_info, loaded, prompt_tokens, sized
from magnitude_bench.harness import Drive, recorded
from scheduler.stats import rnd
from scheduler.types import Priority, Request, SamplingParams
from scheduler.yielding import AGENT_HOLD_MS


@dataclass(frozen=True)
class PersonConfig:
    agents: int = 8  # agents generating when the person's prompt arrives
    agent_prompt: int = 64  # tokens of each agent's prompt
    prompt: int = 1409  # tokens of the person's prompt (the paste)
    gen: int = 4  # tokens the person's reply generates
    warmup_tokens: int = 3  # each agent's tokens before the prompt arrives
    policy: str = "target:50"
    hold_ms: float = AGENT_HOLD_MS


MODES = ("alone", "agents yield", "agents never yield")


@recorded
def run_person(spec: BackendConfig, cfg: PersonConfig, progress=lambda s: None) -> BenchResult:
    need = cfg.agents * (cfg.agent_prompt + 4096) + cfg.prompt + cfg.gen + 1024
    spec = sized(spec, cells=need, seqs=cfg.agents + 1, floor=16384)
    with loaded(spec) as backend:
        runs = {}
        for mode in MODES:
            runs[mode] = _one(backend, cfg, mode)
            progress(f"{mode}: TTFT {runs[mode]['ttft_s']:.3f} s, agents' longest gap "
                     f"{runs[mode]['agent_max_gap_s'] or 0:.3f} s")
        info = backend_info(backend)
    return _result(spec, cfg, runs, info)


def _one(backend, cfg: PersonConfig, mode: str) -> dict:
    """Agents generate (unless alone); the person's prompt arrives; run to its first token and one
    more agent token each. Returns the person's TTFT and what the agents went through meanwhile."""
    drive = Drive(backend, policy=cfg.policy, gen_reserve=cfg.gen)
    drive.engine.scheduler.composer.agent_hold_ms = 0.0 if mode == "agents never yield" else cfg.hold_ms
    agents = [f"agent{i}" for i in range(0 if mode == "alone" else cfg.agents)]
    drive.submit(*(Request(rid, rid, (), SamplingParams(max_tokens=100_000), priority=Priority.AGENT,
                           prompt_tokens=prompt_tokens(backend, cfg.agent_prompt, salt=300 + 11 * i))
                   for i, rid in enumerate(agents)))
    tokens = drive.trace.tokens
    drive.until(lambda: all(len(tokens[rid]) >= cfg.warmup_tokens for rid in agents))
    n0 = len(drive.trace.steps)
    t0 = drive.submit(Request("person", "person", (), SamplingParams(max_tokens=cfg.gen), priority=Priority.INTERACTIVE,
                              prompt_tokens=prompt_tokens(backend, cfg.prompt, salt=7)))
    drive.until(lambda: "person" in drive.trace.ttft_ms)
    t_first = drive.clock()
    drive.until(lambda: all(tokens[rid][-1] > t_first for rid in agents))  # a token after it, so a stall shows
    steps = drive.trace.steps[n0:]
    gaps = [b - a for rid in agents for a, b in zip(tokens[rid], tokens[rid][1:]) if b > t0]
    window = {rid: sum(1 for t in tokens[rid] if t0 < t <= t_first) for rid in agents}
    drive.close()
    return {"ttft_s": drive.trace.ttft_ms["person"] / 1000.0, "agent_max_gap_s": max(gaps) if gaps else None,
            "agent_tok_s": (sum(window.values()) / len(window) / (t_first - t0)) if window else None,
            "yielded_rows": sum(s.yielded_rows for s in steps), "steps": len(steps)}


def _result(spec: BackendConfig, cfg: PersonConfig, runs: dict, info: dict) -> BenchResult:
    res = BenchResult(name="person",
                      title=f"bench person: a {cfg.prompt:,}-token prompt beside {cfg.agents} generating agents",
                      config={"person": asdict(cfg), "backend": asdict(spec)})
    alone = runs["alone"]["ttft_s"]
    res.tables["the person's time to first token, and what the agents went through meanwhile"] = [{
        "mode": mode,
        "ttft_s": rnd(r["ttft_s"], 3),
        "x_alone": rnd(r["ttft_s"] / alone, 2) if alone else None,
        "agent_max_gap_s": rnd(r["agent_max_gap_s"], 3),
        "agent_tok_s": rnd(r["agent_tok_s"], 2),
        "yielded_rows": r["yielded_rows"],
        "steps": r["steps"],
    } for mode, r in runs.items()]
    res.data = {"runs": runs, "backend": info,
                "label": f"{info['backend']}: {cfg.prompt:,}-token INTERACTIVE prompt, {cfg.agents} AGENT "
                         f"sequences generating, {cfg.policy}, hold {cfg.hold_ms:g} ms"}
    res.notes += [
        "TTFT from the moment the person's prompt is submitted; alone: the same prompt with no agent running",
        f"agents yield: while a person's prompt is in prefill, an agent's decode row sits out a step unless its "
        f"last token is {cfg.hold_ms:g} ms old (scheduler/yielding.py); never: every agent keeps its row in "
        "every step (the engine before this rule)",
        "agent_tok_s: each agent's tokens per second between the prompt's arrival and its first token; "
        "agent_max_gap_s: the longest gap between two tokens of one agent from the arrival on",
    ]
    return res
