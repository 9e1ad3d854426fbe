"""Provides `bench spec`: speculative decoding on three tasks at 1-16 sequences, in every `--spec`
mode, on the real model, against llama-server's own speculation, and replayed on a simulated GPU
with the acceptance the real model showed."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from itertools import permutations
from typing import Callable

from backend.factory import BackendConfig, build_backend
from magnitude_bench.common import CPU_CLOCK, BenchResult, backend_info, loaded, prompt_tokens
from magnitude_bench.harness import Drive, recorded
from magnitude_bench.harness import Trace as Run
from magnitude_bench.spec_report import CONTROL, identity_note, merge_reps, run_notes, targets
from magnitude_bench.spec_tasks import Task, task_messages
from magnitude_bench.spec_trace import RecordingSource, Trace, TraceDrafts, summary
from magnitude_tui.engine.core import Engine
from scheduler.drafts import DraftKind, DraftSource
from scheduler.ngram import NgramSource
from scheduler.speculation import SpecMode
from scheduler.stats import median, rnd
from scheduler.types import Request, SamplingParams

MODES = tuple(m.value for m in SpecMode)  # off, ngram, draft, auto


@dataclass(frozen=True)
class SpecBenchConfig:
    widths: tuple[int, ...] = (1, 2, 4, 8, 16)
    tasks: tuple[str, ...] = tuple(t.value for t in Task)
    modes: tuple[str, ...] = ("off", "ngram", "auto", "draft")
    max_tokens: int | None = None  # None: each task's own reply length (Task.reply_tokens)
    reps: int = 1
    min_tokens: int = 1000  # a width repeats beyond `reps` (up to 3 x) until its `off` runs made this many
    policy: str = "target:50"
    draft_model: str | None = None  # None: the model drafts for itself (an upper bound on acceptance)
    cpu_clock: bool = True  # time the real model in CPU seconds of this process (1 thread: a shared machine)
    peer: bool = True  # llama-server with and without its own n-gram speculation
    sim_profile: str = "rx9070xt"
    # A draft step on the simulated GPU: a draft model of ~0.5 GB reads its weights in ~0.8 ms at
    # the profile's 644 GB/s, plus kernel launches; the profile's own fixed cost scaled by weights.
    sim_draft_ms: float = 1.5
    control: bool = False  # each repetition also runs `off` a second time (CONTROL) on the real model

    def reps_at(self, made: int, done: int, extend: bool) -> int:
        """How many repetitions a width runs, after `done` whose `off` runs made `made` tokens:
        `reps`, and while `extend` (the runs include `off`) more until those made `min_tokens`, at
        most 3 x `reps`. A short batch (a quote at one sequence is ~50 tokens, a second of CPU)
        moves by a tenth with a moment's load; a long one averages that out itself."""
        more = extend and made < self.min_tokens
        return max(self.reps, min(3 * self.reps, done + 1)) if more else max(self.reps, done)

    def reply_tokens(self, task: Task) -> int:
        """The longest reply a sequence of `task` may write (greedy; the model's EOS ends it sooner)."""
        return self.max_tokens if self.max_tokens is not None else task.reply_tokens

    def longest_reply(self) -> int:
        return max((self.reply_tokens(Task(t)) for t in self.tasks), default=1)


def _row(run: Run) -> dict:
    """One measured run's row (`width` sequences in one mode, all submitted at once). agg_tok_s runs
    to the last step: a closed batch's tokens over its makespan, which the slowest sequence sets.
    full_tok_s stops where the first sequence ends: the rate while every sequence generates, what a
    batch kept full (a slot refilled as it frees) would make."""
    first = {rid: ts[0] for rid, ts in run.tokens.items() if ts}
    tokens = {rid: len(ts) for rid, ts in run.tokens.items() if ts}
    start = max(first.values())  # every sequence generating: prompts are in
    window = [s for s in run.steps if s.t > start]
    span = (window[-1].t - start) if window else 0.0
    end = min(run.done.values(), default=start)
    full = sum(s.tokens for s in window if s.t <= end)
    per_seq = [(tokens[r] - 1) / (run.done[r] - first[r])
               for r in first if tokens[r] > 1 and run.done.get(r, 0) > first[r]]
    decode = sum(s.decode_rows for s in run.steps)
    drafted, accepted = sum(s.draft_rows for s in run.steps), sum(s.draft_accepted for s in run.steps)
    made = sum(tokens.values()) - len(first)  # tokens from decode rows (not a prompt's last row)
    return {"per_seq_tok_s": rnd(median(per_seq), 2),
            "agg_tok_s": rnd(sum(s.tokens for s in window) / span, 2) if span > 0 else None,
            "full_tok_s": rnd(full / (end - start), 2) if end > start else None,
            "acceptance": rnd(accepted / drafted, 3) if drafted else None,
            "tokens_per_step": rnd(made / decode, 2) if decode else None,
            "draft_rows_per_step": rnd(drafted / decode, 2) if decode else 0.0,
            "tokens": sum(tokens.values())}


def _task_runs(drive: Drive, task: Task, prompts: list[tuple[int, ...]], cfg: SpecBenchConfig,
               modes: tuple[str, ...], off_texts: dict, progress, caps: dict[int, int] | None = None,
               lengths: dict[int, int] | None = None) -> list[dict]:
    """Every width and mode of one task on one engine. Each sequence keeps its conversation (and
    its prompt's KV) between runs, so only a first turn, a warm-up, evaluates a prompt: every
    measured run starts from resident prompts and differs only in its mode. Widths go up, and
    each warms up only its new sequences: no conversation outside the width is resident (without
    flash attention every row would read its cells too). `off_texts` carries the `off` replies
    per (width, repetition) to the runs of another engine; `lengths` receives their lengths per
    sequence (the widest width's). `caps`: a reply length per sequence (the simulated GPU ends
    each reply where the real model's ended; its stand-in tokens never end one)."""
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.reply_tokens(task))
    memory = _ModeMemory()

    def capped(i: int) -> SamplingParams:
        return replace(sampling, max_tokens=caps[i]) if caps and caps.get(i) else sampling
    if cfg.control and "off" in modes:
        modes = modes + (CONTROL,)
    rows, warm = [], 0
    for w in sorted(cfg.widths):
        memory.switch(drive.engine, SpecMode.OFF.value)
        drive.run([Request(f"{task.value}-warm-{i}", f"s{i}", (), replace(sampling, max_tokens=1),
                           prompt_tokens=prompts[i]) for i in range(warm, w)])
        warm = max(warm, w)
        made, rep = 0, 0
        while rep < cfg.reps_at(made, rep, "off" in modes):
            done: dict[str, tuple] = {}
            for mode in rotated(modes, rep):  # side by side: modes alternate inside each repetition
                memory.switch(drive.engine, mode)
                ids = [f"{task.value}-{w}-{mode.replace(' ', '-')}-{rep}-{i}" for i in range(w)]
                run = drive.run([Request(rid, f"s{i}", (), capped(i), prompt_tokens=prompts[i])
                                 for i, rid in enumerate(ids)])
                r = _row(run)
                done[mode] = (r, [run.texts[rid] for rid in ids])
                if mode == "off":
                    if lengths is not None:
                        lengths.update({i: len(run.tokens[rid]) for i, rid in enumerate(ids)})
                    made += run.made()
                progress(f"{task.value} x{w} {mode}: {r['per_seq_tok_s']} tok/s per sequence, "
                         f"{r['agg_tok_s']} aggregate, acceptance {r['acceptance']}")
            if "off" in done:
                off_texts[(w, rep)] = done["off"][1]
            base = off_texts.get((w, rep))
            for mode in modes:
                r, texts = done[mode]
                rows.append({"task": task.value, "seqs": w, "mode": mode, "rep": rep, **r,
                             "same_text_as_off": None if base is None or mode == "off" else texts == base})
            rep += 1
    return rows


class _ModeMemory:
    """Each mode's own learning on an engine that runs every mode in turn: on a switch the
    speculator keeps what the mode before learned aside and goes on from what this mode learned in
    its own earlier runs (the priors at its first), as an engine that always ran it would."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple] = {}
        self._mode: str | None = None

    def switch(self, engine: Engine, mode: str) -> None:
        spec = engine.scheduler.speculator
        if self._mode is not None and self._mode != mode:
            self._kept[self._mode] = spec.learned()
            spec.adopt(self._kept.get(mode))
        self._mode = mode
        engine.set_spec("off" if mode == CONTROL else mode)


def rotated(modes: tuple[str, ...], rep: int) -> tuple[str, ...]:
    """The order the modes run in at repetition `rep`: the rep-th of their orderings (cycling), so
    that from the second repetition on each mode has run right after different ones. A run leaves
    the KV cache as its mode left it (drafts rejected and removed spread the cells the next run's
    rows attend over), so a fixed order would charge that to whichever mode always came next."""
    orders = list(permutations(modes))
    return orders[rep % len(orders)] if orders else ()


@dataclass
class _Bench:
    """What every engine of a run shares: the backend (as the engines see it), the bench clock and
    the calibrated cost model (calibrated once: every engine then prices steps alike)."""

    backend: object
    clock: object  # the bench clock (CPU_CLOCK), or None: the backend's own
    cfg: SpecBenchConfig
    params: object = None

    def drive(self, drafts: dict[DraftKind, DraftSource]) -> Drive:
        drive = Drive(self.backend, clock=self.clock, policy=self.cfg.policy,
                      gen_reserve=self.cfg.longest_reply(), drafts=drafts, params=self.params, calibrate=True,
                      fixed_length=False)
        self.params = drive.params
        return drive


def _task(bench: _Bench, task: Task, prompts, sources: dict[DraftKind, DraftSource], progress,
          caps: dict[int, int] | None = None, lengths: dict[int, int] | None = None) -> list[dict]:
    """One task's runs: off, ngram and auto on an engine with n-gram lookup only (what a user
    without --draft-model runs), then `draft` on one that also has the draft model (the model as
    its own draft: an upper bound on acceptance, not a draft model anyone would pay for).
    `lengths` receives each sequence's `off` reply length."""
    rows: list[dict] = []
    off_texts: dict = {}
    lookup = {DraftKind.NGRAM: sources[DraftKind.NGRAM]}
    for modes, drafts in ((tuple(m for m in bench.cfg.modes if m != "draft"), lookup),
                          (("draft",) if "draft" in bench.cfg.modes and DraftKind.DRAFT_MODEL in sources else (),
                           sources)):
        if not modes:
            continue
        for src in sources.values():
            for key in range(bench.backend.n_seq_max):
                src.forget(key)
        rows += _task_runs(bench.drive(drafts), task, prompts, bench.cfg, modes, off_texts, progress, caps,
                           lengths)
    return rows


def _sources(backend, spec: BackendConfig, cfg: SpecBenchConfig, draft: bool) -> dict[DraftKind, DraftSource]:
    """Recording draft sources: n-gram lookup always, and the draft model when a mode needs it
    (the real model's own file unless --draft-model names another; on a stand-in backend a
    scripted source that guesses every token right, the same upper bound)."""
    sources: dict[DraftKind, DraftSource] = {DraftKind.NGRAM: RecordingSource(NgramSource(), fresh=NgramSource)}
    if not draft:
        return sources
    if spec.family == "llama":
        from backend.draft_model import DraftModelSource

        clock = time.process_time if cfg.cpu_clock else time.perf_counter
        inner = DraftModelSource.load(cfg.draft_model or backend.model_path, backend, device=spec.device,
                                      flash_attn=spec.flash_attn, clock=clock)
    else:
        from backend.fake import Acceptance, ScriptedDrafts

        inner = ScriptedDrafts(backend, Acceptance.ALL, ms=1.0)
    sources[DraftKind.DRAFT_MODEL] = RecordingSource(inner)
    return sources


def _measure(spec: BackendConfig, cfg: SpecBenchConfig, progress) -> tuple[list[dict], dict, dict, dict, dict]:
    """The engine on `spec`'s backend: rows, per-task traces (kind -> Trace), prompt lengths, reply
    lengths (task -> sequence -> tokens of its `off` reply), info."""
    width = max(cfg.widths)
    backend = build_backend(replace(spec, n_seq_max=max(spec.n_seq_max, width),
                                    n_ctx=spec.n_ctx or width * 1024 if spec.family == "llama" else spec.n_ctx))
    cpu = cfg.cpu_clock and backend.known_costs is None
    bench = _Bench(backend, CPU_CLOCK if cpu else None, cfg)
    sources = _sources(backend, spec, cfg, "draft" in cfg.modes)
    traces: dict[str, dict[str, Trace]] = {}
    lengths: dict[str, list[int]] = {}
    replies: dict[str, dict[int, int]] = {}
    rows: list[dict] = []
    try:
        for name in cfg.tasks:
            task = Task(name)
            prompts = [tuple(backend.tokenize_chat(task_messages(task, i))) for i in range(width)]
            if spec.family != "llama":  # a stand-in: its tokenizer counts characters
                prompts = [prompt_tokens(backend, min(len(p), 600), salt=31 * i) for i, p in enumerate(prompts)]
            lengths[name] = [len(p) for p in prompts]
            for src in sources.values():
                src.clear()
            rows += _task(bench, task, prompts, sources, progress, lengths=replies.setdefault(name, {}))
            traces[name] = {src.kind.value: Trace(list(src.guesses), src.replies()) for src in sources.values()}
        info = backend_info(backend)
        info["clock"] = "CPU seconds of the engine process" if cpu else "backend clock"
        info["attention"] = backend.info.get("attention")
    finally:
        draft = sources.get(DraftKind.DRAFT_MODEL)
        if draft is not None and hasattr(draft.inner, "close"):
            draft.inner.close()
        backend.close()
    return rows, traces, lengths, replies, info


def _replay(cfg: SpecBenchConfig, traces: dict, lengths: dict, replies: dict, progress) -> list[dict]:
    """The same tasks on the simulated GPU, each source replaying its guesses on the real model (the
    lookup: at each sequence's own position in a real reply), each sequence's reply ending where the
    real model's `off` reply to the same prompt ended (at EOS or max_tokens): a batch drains as it
    did there."""
    width = max(cfg.widths)
    with loaded(BackendConfig(kind=f"simulated:{cfg.sim_profile}", n_seq_max=max(16, width))) as backend:
        bench = _Bench(backend, None, replace(cfg, control=False))  # its clock repeats exactly
        rows: list[dict] = []
        for name in cfg.tasks:
            t = traces[name]
            lookup = t.get("ngram", Trace([]))
            sources: dict[DraftKind, DraftSource] = {
                DraftKind.NGRAM: TraceDrafts(backend, DraftKind.NGRAM, lookup.guesses, replies=lookup.replies)}
            if t.get("draft") and t["draft"].guesses:
                sources[DraftKind.DRAFT_MODEL] = TraceDrafts(backend, DraftKind.DRAFT_MODEL, t["draft"].guesses,
                                                             step_ms=cfg.sim_draft_ms)
            prompts = [prompt_tokens(backend, n, salt=31 * i) for i, n in enumerate(lengths[name])]
            rows += _task(bench, Task(name), prompts, sources, lambda s: progress("simulated " + s),
                          caps=replies.get(name))
    return rows


@recorded
def run_spec(spec: BackendConfig, cfg: SpecBenchConfig, progress: Callable[[str], None] = lambda s: None,
             peer: Callable[..., list[dict]] | None = None) -> BenchResult:
    rows, traces, lengths, replies, info = _measure(spec, cfg, progress)
    real = merge_reps(rows)
    sim_rows = _replay(cfg, traces, lengths, replies, progress)
    sim = merge_reps(sim_rows)
    res = BenchResult(name="spec", title="bench spec: speculative decoding in the shared batch",
                      config={"spec": asdict(cfg), "backend": asdict(spec)})
    res.tables[f"engine on {info['backend']} ({info['clock']})"] = real
    if peer is not None:
        try:
            peer_rows = peer(spec, cfg, lengths, progress)
        except Exception as exc:  # the engine's rows took most of the run: a failing peer must not lose them
            peer_rows = [{"task": "-", "seqs": None, "spec_type": "-", "note": f"the peer failed: {exc}"}]
        res.tables["llama-server's own speculation (same tasks and widths)"] = peer_rows
    res.tables[f"simulated {cfg.sim_profile}, replaying the real model's acceptance"] = sim
    res.tables["acceptance traces (each source's guesses against the committed tokens)"] = [
        {"task": task, "source": kind, **summary(trace.guesses), "replies": len(trace.replies),
         "every_position": summary([g for r in trace.replies for g in r.guesses])["match_rate"]}
        for task, kinds in traces.items() for kind, trace in kinds.items()]
    reps: dict[str, dict[int, int]] = defaultdict(dict)
    for r in rows:
        if r["mode"] == "off":
            reps[r["task"]][r["seqs"]] = max(reps[r["task"]].get(r["seqs"], 0), r["rep"] + 1)
    res.repetitions = [{"side": "engine", **r} for r in rows] + [{"side": "simulated", **r} for r in sim_rows]
    res.data = {"backend": info, "prompt_tokens": lengths, "reply_tokens": replies, "repetitions": dict(reps),
                "targets": targets(real, sim)}
    res.notes += run_notes(cfg, res.data["targets"]) + [identity_note(info)]
    return res
