"""Provides `bench prefill-curve`: prefill tok/s per chunk size, decode step per batch width, and the fit."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from backend.factory import BackendConfig, reset_kv
from magnitude_bench.common import OTHERS_NOTE, BenchResult, backend_info, loaded, measured, prompt_tokens
from magnitude_bench.harness import calibrated, recorded
from scheduler.stats import median, rnd
from scheduler.types import BatchPlan, DecodeOutcome, SeqSlice

DEFAULT_CHUNKS = tuple(2 ** i for i in range(12))  # 1 .. 2048
DEFAULT_SEQS = (1, 2, 4, 8, 12, 16)


@dataclass(frozen=True)
class CurveConfig:
    chunks: tuple[int, ...] = DEFAULT_CHUNKS
    n_decode: int = 8  # decode rows beside the chunk in the "with decode" mode
    seqs: tuple[int, ...] = DEFAULT_SEQS
    context: int = 32  # tokens each decoding sequence already holds
    reps: int = 3
    # Cells another (idle) sequence holds while the decode step is timed: in a unified KV cache
    # every row's attention spans all cells in use, so a long newcomer slows everyone's decode.
    kv_fill: tuple[int, ...] = (0, 1024, 2048, 4096)


class _Bench:
    """Timed native steps on free sequence slots; every step is rolled back, so all repetitions
    see the same cache (decode rows at the same positions, the chunk always from position 0)."""

    def __init__(self, backend, cfg: CurveConfig) -> None:
        self.b, self.cfg = backend, cfg
        self.prefill_seq = backend.n_seq_max - 1  # the decoders take the slots below it
        self.decoders = list(range(min(backend.n_seq_max - 1, max(max(cfg.seqs), cfg.n_decode))))
        self.text = prompt_tokens(backend, max(*cfg.chunks, *cfg.kv_fill) + cfg.context + 8, salt=3)
        self.busy: dict[tuple[int, int, int], float] = {}  # cores other processes used per measured point
        self.repetitions: list[dict] = []  # every timed step, not only each point's median
        reset_kv(backend)
        for s in self.decoders:  # each decoder holds `context` tokens of its own prompt
            self.step([SeqSlice(s, 0, prompt_tokens(backend, cfg.context, salt=s + 1), True, False)])

    def step(self, slices: list[SeqSlice]) -> float:
        plan = BatchPlan(step=0, slices=tuple(slices), budget=sum(len(s.tokens) for s in slices))
        result = self.b.decode(plan)
        if result.outcome is not DecodeOutcome.OK:
            raise RuntimeError(f"decode failed ({result.outcome}) for {plan.n_decode} decode + "
                               f"{plan.n_prefill} prompt rows")
        return result.step_ms

    def timed(self, n_decode: int, chunk: int, at: int = 0) -> float:
        """Median step time of n_decode decode rows plus a chunk of prompt rows continuing the
        prompt sequence at position `at` (ms); on real hardware measured while no other process
        competes for the cores (again if one did)."""
        if self.b.name.startswith("simulated"):
            return self._timed(n_decode, chunk, at)
        ms, self.busy[(n_decode, chunk, at)] = measured(lambda: self._timed(n_decode, chunk, at))
        return ms

    def _timed(self, n_decode: int, chunk: int, at: int) -> float:
        times = []
        for _ in range(self.cfg.reps):
            slices = [SeqSlice(s, self.cfg.context, (self.text[s],), True, True)
                      for s in self.decoders[:n_decode]]
            if chunk:
                slices.append(SeqSlice(self.prefill_seq, at, tuple(self.text[at:at + chunk]), True, False))
            times.append(self.step(slices))
            for s in self.decoders[:n_decode]:
                self.b.kv_keep_prefix(s, self.cfg.context)
            if chunk:
                self.b.kv_keep_prefix(self.prefill_seq, at)
        self.repetitions.append({"decode_rows": n_decode, "prompt_rows": chunk, "at": at,
                                 "step_ms": [rnd(t, 3) for t in times]})
        ms = median(times)
        assert ms is not None, "reps must be 1 or more"
        return ms


def run_curve(spec: BackendConfig, cfg: CurveConfig, *, progress=lambda s: None) -> dict:
    with loaded(spec) as backend:
        bench = _Bench(backend, cfg)
        bench.timed(min(4, len(bench.decoders)), 64)  # warm-up, not recorded
        points: list[tuple[int, int, float]] = []  # (decode rows, prompt rows, ms)
        decode: list[dict[str, Any]] = []
        for n in cfg.seqs:
            n = min(n, len(bench.decoders))
            ms = bench.timed(n, 0)
            decode.append({"seqs": n, "step_ms": rnd(ms, 2), "agg_tok_s": rnd(1000 * n / ms, 1)})
            points.append((n, 0, ms))
        progress(f"{backend.name}: decode step {decode[0]['step_ms']} ms (1 seq) .. "
                 f"{decode[-1]['step_ms']} ms ({decode[-1]['seqs']} seqs)")
        n_dec = min(cfg.n_decode, len(bench.decoders))
        base = next((ms for d, _, ms in points if d == n_dec), None) or bench.timed(n_dec, 0)
        prefill: list[dict[str, Any]] = []
        for chunk in cfg.chunks:
            for mode, d in (("alone", 0), ("with_decode", n_dec)):
                c = min(chunk, backend.n_batch - d, backend.n_ctx // 2)
                ms = bench.timed(d, c)
                points.append((d, c, ms))
                # Beside decode rows, the prompt's share of the step is what it adds to the decode step.
                extra = ms - (base if d else 0.0)
                prefill.append({"mode": mode, "chunk": c, "decode_rows": d, "step_ms": rnd(ms, 2),
                                "prefill_tok_s": rnd(1000 * c / extra, 1) if extra > 0 else None})
            progress(f"  chunk {chunk:>5}: alone {prefill[-2]['prefill_tok_s']} tok/s, beside {n_dec} "
                     f"decode rows {prefill[-1]['prefill_tok_s']} tok/s")
        occupancy = _occupancy(bench, n_dec, progress)
        fit = fit_cost(points)
        for r in decode:
            r["model_step_ms"] = rnd(predict(fit, r["seqs"], 0), 2)
        for r in prefill:
            ms = predict(fit, r["decode_rows"], r["chunk"]) - (predict(fit, r["decode_rows"], 0) if r["decode_rows"] else 0)
            r["model_prefill_tok_s"] = rnd(1000 * r["chunk"] / ms, 1) if ms > 0 else None
        try:  # the cost model target:MS starts from on this backend; the table still stands without it
            engine_cal: dict = {k: rnd(v, 4) for k, v in asdict(calibrated(backend)).items()}
        except Exception as e:
            engine_cal = {"error": str(e)}
        reset_kv(backend)
        return {"backend": backend_info(backend), "n_decode": n_dec, "decode": decode, "prefill": prefill,
                "occupancy": occupancy,
                "fit": {k: rnd(v, 4) for k, v in fit.items()}, "engine_calibration": engine_cal,
                "others_cores_max": rnd(max(bench.busy.values(), default=0.0), 2),
                "repetitions": bench.repetitions,
                "label": f"{backend.name}: prefill and decode cost"}


def _occupancy(bench: _Bench, n_dec: int, progress) -> list[dict]:
    """What a long prompt in the cache does to a step: the n_dec-sequence decode step, and the same
    plus a 16-row chunk continuing that prompt, while it holds 0, 1k, 2k, 4k cells. In a unified KV
    cache every row's attention spans all cells in use; a chunk's rows also attend over its prompt."""
    b, seq, held, rows = bench.b, bench.prefill_seq, 0, []
    room = b.n_ctx - len(bench.decoders) * (bench.cfg.context + 2) - 64
    for k in (k for k in bench.cfg.kv_fill if k + 16 <= room):
        while held < k:  # grow the prompt (untimed) in n_batch pieces
            n = min(k - held, b.n_batch)
            bench.step([SeqSlice(seq, held, tuple(bench.text[held:held + n]), True, False)])
            held += n
        rows.append({"prompt_cells": k, "decode_rows": n_dec, "decode_step_ms": rnd(bench.timed(n_dec, 0), 2),
                     "with_chunk16_ms": rnd(bench.timed(n_dec, 16, at=k), 2)})
    b.kv_remove(seq)
    if rows:
        last = rows[-1]
        progress(f"  {n_dec}-sequence decode step with a {last['prompt_cells']}-cell prompt in the cache: "
                 f"{last['decode_step_ms']} ms, +16-row chunk {last['with_chunk16_ms']} ms "
                 f"(empty cache: {rows[0]['decode_step_ms']} / {rows[0]['with_chunk16_ms']} ms)")
    return rows


def fit_cost(points: list[tuple[int, int, float]]) -> dict:
    """step_ms = fixed + per_decode_row * d + per_prefill_row * p, fitted on relative error (each
    point weighted 1/ms: a 9 s chunk must not drown a 7 ms decode step) with no negative term."""
    x = np.array([[1.0, d, p] for d, p, _ in points])
    y = np.array([ms for _, _, ms in points])
    keep = [0, 1, 2]
    while True:
        w = 1.0 / y
        sol, *_ = np.linalg.lstsq(x[:, keep] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(sol)))  # a negative cost is noise: drop that term and refit
    theta = np.zeros(3)
    theta[keep] = np.maximum(sol, 0.0)
    rel = np.abs(x @ theta - y) / y
    return {"fixed_ms": float(theta[0]), "decode_ms": float(theta[1]), "prefill_ms": float(theta[2]),
            "prefill_tok_s": 1000.0 / float(theta[2]) if theta[2] > 0 else float("nan"),
            "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max())}


def predict(fit: dict, d: int, p: int) -> float:
    return fit["fixed_ms"] + fit["decode_ms"] * d + fit["prefill_ms"] * p


@recorded
def curve_result(spec: BackendConfig, cfg: CurveConfig, progress=lambda s: None) -> BenchResult:
    # One slot per decoding sequence plus one for the chunk.
    spec = replace(spec, n_seq_max=max(spec.n_seq_max, max(cfg.seqs) + 1, cfg.n_decode + 1))
    data = run_curve(spec, cfg, progress=progress)
    repetitions = data.pop("repetitions")
    res = BenchResult(name="prefill-curve", title="bench prefill-curve: what a prompt row and a decode row cost",
                      config={"curve": asdict(cfg), "backend": asdict(spec)}, data=data, repetitions=repetitions)
    res.tables["decode step against generating sequences"] = data["decode"]
    res.tables[f"prefill against chunk size (alone / beside {data['n_decode']} decode rows)"] = [
        {"chunk": a["chunk"], "alone_ms": a["step_ms"], "alone_tok_s": a["prefill_tok_s"],
         "model_alone_tok_s": a["model_prefill_tok_s"], "with_decode_ms": w["step_ms"],
         "with_decode_tok_s": w["prefill_tok_s"], "model_with_decode_tok_s": w["model_prefill_tok_s"]}
        for a, w in zip(data["prefill"][0::2], data["prefill"][1::2])]
    fit, cal = data["fit"], data["engine_calibration"] or {}
    res.tables["cost model: step_ms = fixed + a*decode_rows + b*prefill_rows"] = [
        {"model": "least squares (relative error) over every point above", "fixed_ms": fit["fixed_ms"], "a_ms": fit["decode_ms"],
         "b_ms": fit["prefill_ms"], "median_rel_err": fit["median_rel_err"], "max_rel_err": fit["max_rel_err"]},
        {"model": "engine calibration (what target:MS starts from)", "fixed_ms": cal.get("fixed_ms"),
         "a_ms": cal.get("decode_ms"), "b_ms": cal.get("prefill_ms"), "median_rel_err": None, "max_rel_err": None},
    ]
    occ = data["occupancy"]
    if occ:
        res.tables[f"{data['n_decode']}-sequence decode step (and + a 16-row chunk of a prompt) by the prompt's cells"] = [
            {**r, "decode_x_empty": rnd(r["decode_step_ms"] / occ[0]["decode_step_ms"], 2),
             "chunk_x_empty": rnd(r["with_chunk16_ms"] / occ[0]["with_chunk16_ms"], 2)} for r in occ]
    res.notes.append("prefill tok/s beside decode rows = chunk / (step time - the decode-only step time)")
    res.notes.append(OTHERS_NOTE)
    res.notes.append(f"medians of {cfg.reps} repetitions; every timed step includes llama_synchronize")
    return res
