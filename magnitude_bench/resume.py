"""Provides `bench resume`: TTFT of the first reply after a resume, cold (the whole history
prefilled again) vs warm (the history's KV restored from disk), alternated in one run."""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, replace

from backend.factory import BackendConfig, reset_kv
from magnitude_bench.common import PASSAGE, BenchResult, backend_info, loaded
from magnitude_bench.harness import Drive, recorded, sweep
from magnitude_tui.engine.events import RestoreOutcome
from magnitude_tui.engine.warm_store import WarmStore
from scheduler.stats import median, rnd
from scheduler.types import Message, Request, SamplingParams


@dataclass(frozen=True)
class ResumeConfig:
    history_tokens: int = 2000  # the conversation before the resume (chat template included)
    gen: int = 8  # tokens of the reply after the resume
    reps: int = 3  # cold and warm alternate, this many times each
    policy: str = "fixed:512"  # the largest prompt chunks: cold prefill at its fastest


def conversation(backend, n_tokens: int) -> list[Message]:
    """User and assistant turns cut from a passage until the templated chat up to the last user
    message holds at least n_tokens; the last assistant message is replaced by the model's reply
    to that message (the turn the app quit after)."""
    words = PASSAGE.split()
    messages: list[Message] = []
    i = 0
    while len(backend.tokenize_chat(messages[:-1], add_generation_prompt=True)) < n_tokens:
        turn = " ".join(words[(i * 37 + k) % len(words)] for k in range(60))
        messages += [Message("user", f"Question {i + 1}: what do you make of this? {turn}"),
                     Message("assistant", f"Answer {i + 1}: {turn[::-1][:200]}")]
        i += 1
    return messages


def _turn(drive: Drive, rid: str, messages: list[Message], gen: int) -> dict:
    """Submit one turn and run it to the end: TTFT (as the engine measures it), cached rows."""
    tr = drive.run([Request(rid, "conv", tuple(messages), SamplingParams(temperature=0.0, max_tokens=gen))])
    return {"ttft_ms": tr.ttft_ms[rid], "cached": tr.cached[rid], "prompt": tr.prompt_total[rid],
            "text": tr.texts[rid]}


def _engine(backend, cfg: ResumeConfig, store: WarmStore | None) -> Drive:
    """A freshly started engine as the app starts one: the model's own replies, its coalescing window."""
    return Drive(backend, policy=cfg.policy, fixed_length=False, calibrate=False, coalesce_ms=5.0, warm=store)


@recorded
def run_resume(spec: BackendConfig, cfg: ResumeConfig, progress=lambda s: None) -> BenchResult:
    spec = replace(spec, n_ctx=spec.n_ctx or max(4096, cfg.history_tokens * 2))
    with tempfile.TemporaryDirectory(prefix="magnitude-resume-") as kv_dir, loaded(spec) as backend:
        store = WarmStore(kv_dir, layout=backend.state_layout, budget_bytes=1 << 34)
        try:
            history = conversation(backend, cfg.history_tokens)
            # The session before the quit: its last turn runs, and quitting saves the conversation.
            first = _engine(backend, cfg, store)
            asked = history[:-1]
            before = _turn(first, "before", asked, cfg.gen)
            history = asked + [Message("assistant", before["text"])]
            t0 = time.perf_counter()
            first.engine.shutdown()
            warm = first.engine.warm
            assert warm is not None  # the engine was given the store
            save = {"copy_ms": warm.last_save_ms, "write_ms": store.last_write_ms,
                    "quit_ms": (time.perf_counter() - t0) * 1000.0, "bytes": warm.last_state_bytes,
                    "history_tokens": before["prompt"]}
            follow_up = history + [Message("user", "Now sum it all up in one sentence.")]

            def one(mode: str, rep: int) -> dict:
                run = _resumed(backend, store if mode == "warm" else None, history, follow_up, cfg)
                progress(f"rep {rep + 1} {mode}: TTFT {run['ttft_ms']:.0f} ms, {run['cached']:,} of "
                         f"{run['prompt']:,} prompt tokens cached, restore {run['restore_ms']:.0f} ms")
                return run

            records = sweep(("cold", "warm"), cfg.reps, one, quiet=False)
            runs = {mode: [r for r in records if r["config"] == mode] for mode in ("cold", "warm")}
            info = backend_info(backend)
        finally:
            reset_kv(backend)
    res = _result(spec, cfg, runs, save, info)
    res.repetitions = records
    return res


def _resumed(backend, store: WarmStore | None, history: list[Message], follow_up: list[Message],
             cfg: ResumeConfig) -> dict:
    """A freshly started engine; warm: the history's KV restored first (as `--resume` does)."""
    drive = _engine(backend, cfg, store)
    restore_ms = 0.0
    if store is not None:
        drive.engine.restore_session("conv", history)
        drive.step()
        [notice] = drive.engine.take_notices()
        if notice.outcome is not RestoreOutcome.RESTORED:
            raise RuntimeError(f"the saved conversation was not restored: {notice.outcome.value}: {notice.detail}")
        restore_ms = notice.load_ms
    run = _turn(drive, "after", follow_up, cfg.gen)
    run["restore_ms"] = restore_ms
    run["ttft_incl_restore_ms"] = run["ttft_ms"] + restore_ms
    return run


def _result(spec: BackendConfig, cfg: ResumeConfig, runs: dict, save: dict, info: dict) -> BenchResult:
    res = BenchResult(name="resume", title=f"bench resume: first reply after a resume, {save['history_tokens']:,}-"
                      "token conversation, cold vs warm", config={"resume": asdict(cfg), "backend": asdict(spec)})
    cold_ttft = median(r["ttft_ms"] for r in runs["cold"])
    rows = []
    for mode, rs in runs.items():
        ttft = median(r["ttft_ms"] for r in rs)
        incl = median(r["ttft_incl_restore_ms"] for r in rs)
        rows.append({"mode": mode, "runs": len(rs), "ttft_p50_ms": rnd(ttft, 1),
                     "ttft_incl_restore_ms": rnd(incl, 1), "restore_ms": rnd(median(r["restore_ms"] for r in rs), 1),
                     "cached_tokens": min(r["cached"] for r in rs), "prompt_tokens": rs[0]["prompt"],
                     "x_of_cold": rnd(incl / cold_ttft, 3) if cold_ttft and incl is not None else None})
    res.tables["time to first token after the resume (alternating, median)"] = rows
    res.tables["the saved state"] = [{
        "history_tokens": save["history_tokens"], "state_mb": rnd(save["bytes"] / 2**20, 1),
        "bytes_per_token": int(save["bytes"] / max(1, save["history_tokens"])),
        "copy_from_kv_ms": rnd(save["copy_ms"], 1), "write_file_ms": rnd(save["write_ms"], 1),
        "quit_total_ms": rnd(save["quit_ms"], 1)}]
    res.data = {"runs": runs, "save": save, "backend": info}
    res.notes += [
        "cold: a fresh engine prefills the whole conversation plus the new turn; warm: a fresh engine first "
        "restores the conversation's saved KV (read, CRC-checked, llama_state_seq_set_data) and prefills "
        "only the new turn. Both alternate on one loaded model; x_of_cold counts the restore in the warm TTFT.",
        "copy_from_kv_ms is what the engine thread spends (llama_state_seq_get_data); the file is written "
        "by a background thread (write_file_ms).",
    ]
    return res
