"""Reading a bench spec run: each mode's repetitions merged into ratios to `off` of the same
repetition, the issue's three targets read off them, and the notes printed under the tables
(the runs themselves: spec.py)."""

from __future__ import annotations

from collections import defaultdict

from magnitude_bench.spec_tasks import Task
from scheduler.stats import median, rnd

CONTROL = "off again"  # `off` a second time in each repetition: identical work, the measurement's own spread


RATIOS = (("per_seq_tok_s", "x_off_per_seq"), ("agg_tok_s", "x_off_agg"), ("full_tok_s", "x_off_full"))


def merge_reps(rows: list[dict]) -> list[dict]:
    """Medians over repetitions; each mode's ratio to `off` is the median of its ratios to the `off`
    run of the same repetition (the runs side by side: a stretch of load that slows one repetition
    slows both runs of a pair, not one median)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["seqs"], r["mode"])].append(r)
    off = {(r["task"], r["seqs"], r["rep"]): r for r in rows if r["mode"] == "off"}
    out = []
    for (task, w, mode), rs in groups.items():
        m = {"task": task, "seqs": w, "mode": mode}
        for col in ("per_seq_tok_s", "agg_tok_s", "full_tok_s", "acceptance", "tokens_per_step",
                    "draft_rows_per_step", "tokens"):
            m[col] = rnd(median(r[col] for r in rs if r[col] is not None), 3)
        same = [r["same_text_as_off"] for r in rs if r["same_text_as_off"] is not None]
        m["same_text_as_off"] = all(same) if same else None
        for col, name in RATIOS:
            pairs = [(r[col], off[(task, w, r["rep"])][col]) for r in rs if (task, w, r["rep"]) in off]
            m[name] = rnd(median(a / b for a, b in pairs if a and b), 3)
        out.append(m)
    return out


def targets(real: list[dict], sim: list[dict]) -> dict:
    """The issue's three targets, read off one run's ratios. `auto` against `off` at a width is read
    on the rate while that many sequences generate (`x_off_full`) and per sequence, on the real model
    and on the simulated GPU (`auto_min_x_off`, `simulated_auto_min_x_off`): a closed batch's
    aggregate to its last step (`x_off_agg`, reported beside) also prices the drain after the
    first reply ends, at narrower widths, where a sequence whose reply is nearly done saves the
    batch only its own rows (docs/design/speculation.md)."""

    def col(rows: list[dict], name: str) -> list[float]:
        return [r[name] for r in rows if r["mode"] == "auto" and r[name] is not None]

    auto, auto_seq, auto_full = col(real, "x_off_agg"), col(real, "x_off_per_seq"), col(real, "x_off_full")
    rep1 = [max(r["x_off_per_seq"] or 0, r["x_off_agg"] or 0) for r in real
            if r["task"] == Task.REPETITIVE.value and r["seqs"] == 1 and r["mode"] in ("ngram", "auto")]
    gpu = {r["seqs"]: r["x_off_agg"] for r in sim
           if r["task"] == Task.REPETITIVE.value and r["mode"] == "auto" and r["seqs"] <= 4}
    control = [r[name] for r in real if r["mode"] == CONTROL for name in ("x_off_full", "x_off_per_seq")
               if r[name] is not None]
    return {"auto_min_x_off": min(auto_full + auto_seq, default=None),
            "simulated_auto_min_x_off": min(col(sim, "x_off_full") + col(sim, "x_off_per_seq"), default=None),
            "auto_min_x_off_agg": min(auto, default=None), "simulated_auto_min_x_off_agg": min(col(sim, "x_off_agg"),
                                                                                            default=None),
            "auto_min_x_off_per_seq": min(auto_seq, default=None), "auto_min_x_off_full": min(auto_full, default=None),
            "repetitive_1_seq_best_x_off": max(rep1, default=None), "simulated_repetitive_auto_x_off": gpu,
            # `off` again against `off`: what identical work reads on this machine (None without --control)
            "control_x_off": [min(control), max(control)] if control else None}


def identity_note(info: dict) -> str:
    """Why same_text_as_off may be False at temperature 0 on this run's kernels."""
    attention = info.get("attention") or "n/a"
    return (f"same_text_as_off on {attention}, {info.get('n_threads', '?')} thread(s): llama.cpp's CPU kernels compute "
            "a single-row step otherwise than a batch of 2+ rows (dense attention's matrix multiply; flash attention "
            "on 2+ threads from 512 cells), which moves a verified row's logits by up to ~0.8 against the same row "
            "decoded alone; a near-tie may then flip. With --flash-attn on --threads 1 the logits are bit-identical "
            "at 1 sequence; with several, rejected drafts also move where a sequence's cells lie (the order "
            "attention sums them). See docs/design/speculation.md")


def run_notes(cfg, t: dict) -> list[str]:  # cfg: spec.SpecBenchConfig (spec.py imports this module)
    return [
        "per_seq_tok_s: median over sequences of tokens after the first / time from first to last token; "
        "agg_tok_s: tokens committed once every sequence generates / that window, to the last step (a closed "
        "batch's makespan: the slowest sequence sets it); full_tok_s: the same up to the step where the first "
        "sequence ends (the rate while every sequence generates); x_off_*: ÷ the `off` run of the same task and "
        "width: the median of the ratios to the `off` run of the same repetition (modes alternate inside each)",
        f"{CONTROL} (with --control): `off` run a second time in each repetition; its x_off_* is what identical "
        "work reads on this machine, the spread any mode's ratio carries",
        "acceptance: accepted ÷ verified draft rows; tokens_per_step: tokens a generating sequence gains per "
        "decode row (1 + accepted drafts); same_text_as_off: greedy replies identical to `off`",
        "draft: the model drafts for itself (identical weights: every draft is what the target would say, the "
        "upper bound on acceptance) and pays a target-sized step per draft token and its prompt again",
        "simulated: n-gram lookup replays the guess a fresh lookup made at the sequence's own position in a real "
        "reply (each finished reply judged at every position: how many tokens it proposed and how many matched); "
        f"a draft model replays its guesses on the real model in order, cycling; a draft step costs "
        f"{cfg.sim_draft_ms} ms there; each simulated reply ends where the real `off` reply to its prompt ended",
        "replies: " + (f"at most {cfg.max_tokens} tokens" if cfg.max_tokens is not None else
                       ", ".join(f"{t} at most {cfg.reply_tokens(Task(t))} tokens" for t in cfg.tasks))
        + " (greedy; EOS ends a reply sooner)",
        f"targets: auto ≥ 0.97x off at every width, while that many generate and per sequence (min "
        f"{t['auto_min_x_off']}; simulated {t['simulated_auto_min_x_off']}; the closed batch's aggregate to its "
        f"last step, drain included: {t['auto_min_x_off_agg']}, simulated {t['simulated_auto_min_x_off_agg']}); "
        f"repetitive at 1 sequence ≥ 1.3x ({t['repetitive_1_seq_best_x_off']}); simulated GPU ≥ 2x at 1-4 "
        f"sequences ({t['simulated_repetitive_auto_x_off']})"
        + (f"; identical work (`{CONTROL}` ÷ off) read {t['control_x_off'][0]}–{t['control_x_off'][1]}"
           if t.get("control_x_off") else ""),
    ]
