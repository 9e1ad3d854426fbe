"""Counts the instructions of each llama_decode call, this engine's vs llama-batched-bench's, under callgrind."""

# Wall-clock ratios mean little on a shared machine; instruction counts do not depend on the load.
# Each side runs under `valgrind --tool=callgrind`, collecting only inside llama_decode and dumping
# after every call, so each dump is one call's instructions (Ir). The engine side is
# scripts/step_driver.py (this project's LlamaBackend, built as the app builds it); the peer side is
# llama-batched-bench with the matching -npp/-ntg/-npl and one thread.
#
# Valgrind cannot run AVX-512 code, and both builds here compile ggml's CPU backend for the host
# (GGML_NATIVE): pass --ggml-cpu-dir, a folder holding a libggml-cpu.so.0 built from the same
# llama.cpp source without AVX-512 (see docs/BENCHMARKS.md); it is put first on LD_LIBRARY_PATH,
# so both sides run the same CPU kernels and their own libllama/libggml.
#
#   .venv/bin/python scripts/callgrind_compare.py --ggml-cpu-dir /tmp/vg28/lib --prompt 32 \
#       --case engine:off --case engine:on --case bench:auto --jobs 2 --out docs/benchmarks/x.json

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# llama_decode reaches this method through tail calls that callgrind does not see as entries; it
# is exported by both builds' libllama and runs once per llama_decode.
DECODE = "llama_context::decode(llama_batch_ext const&)"


def valgrind_cmd(out_prefix: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={DECODE}",
            f"--dump-after={DECODE}", f"--callgrind-out-file={out_prefix}"]


def per_call_ir(out_prefix: Path) -> list[int]:
    """Instructions of each dump, in call order (the dump at exit, collected outside any call, is dropped)."""
    dumps = []
    for f in out_prefix.parent.glob(out_prefix.name + ".*"):
        m = re.fullmatch(re.escape(out_prefix.name) + r"\.(\d+)", f.name)
        if m:
            dumps.append((int(m.group(1)), f))
    out = []
    for _, f in sorted(dumps):
        text = f.read_text(errors="replace")
        m = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        out.append(int(m.group(1)) if m else 0)
    return out


def top_functions(dump: Path, n: int = 12) -> list[dict]:
    """The functions with the most own instructions in one dump (callgrind_annotate)."""
    try:
        text = subprocess.run(["callgrind_annotate", "--threshold=99", str(dump)], capture_output=True,
                              text=True, timeout=600).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(?:\S+:)?(.+?)(?:\s+\[.*\])?$", line)
        if m and len(rows) < n:
            rows.append({"ir": int(m.group(1).replace(",", "")), "share": float(m.group(2)),
                         "function": m.group(3)[:120]})
    return rows


def run_case(side: str, flash: str, args, work: Path, env: dict) -> dict:
    prefix = work / f"{side}-{flash}-nsm{args.n_seq_max}-ub{args.ubatch}-c{args.ctx}.cg"
    if side in ("engine", "scheduler"):
        shapes = work / f"{prefix.name}.shapes.json"
        via = "engine" if side == "scheduler" else "backend"
        cmd = [sys.executable, str(ROOT / "scripts" / "step_driver.py"), "--via", via, "--flash", flash,
               "--seqs", str(args.seqs),
               "--prompt", str(args.prompt), "--steps", str(args.steps), "--ctx", str(args.ctx),
               "--n-seq-max", str(args.n_seq_max), "--ubatch", str(args.ubatch), "--shapes-out", str(shapes)]
        if args.model:
            cmd += ["--model", args.model]
    else:
        from magnitude_bench import peers

        found = peers.tools_dir()
        if not found:
            raise SystemExit("llama.cpp's tools are not built: scripts/build_llama_tools.sh")
        model = args.model or _default_model()
        cmd = [str(found[0] / "llama-batched-bench"), "-m", model, "-c", str(args.ctx), "-b", "2048",
               "-ub", str(args.ubatch), "-t", "1", "-tb", "1", "-kvu", "-dev", "none", "-ngl", "0",
               "-npp", str(args.prompt), "-ntg", str(args.steps), "-npl", str(args.seqs),
               "-fa", flash, "--output-format", "jsonl"]
    proc = subprocess.run(valgrind_cmd(prefix) + cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{side} {flash} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    irs = per_call_ir(prefix)
    if side != "bench":
        meta = json.loads(shapes.read_text())
        calls = meta["calls"]
        irs = irs[:len(calls)]
        note = meta["attention"]
    else:
        # warm-up (16 rows of seq 0), the prompts in one batch, then one call per step
        calls = ([{"rows": 16, "seqs": 1}, {"rows": args.seqs * args.prompt, "seqs": args.seqs}]
                 + [{"rows": args.seqs, "seqs": args.seqs}] * args.steps)
        irs = irs[:len(calls)]
        log = proc.stdout + proc.stderr
        m = re.search(r"flash_attn\s*=\s*auto\s*->\s*(\w+)", log) or re.search(r"flash_attn\s*=\s*(-?\w+)", log)
        note = f"llama.cpp log: flash_attn = {m.group(1) if m else '?'}"
    steps = [ir for c, ir in zip(calls, irs) if c["rows"] == args.seqs and c["seqs"] == args.seqs]
    prefill = [ir for c, ir in zip(calls, irs) if c["rows"] == args.seqs * args.prompt]
    first_step = next((i for i, c in enumerate(calls) if c["rows"] == args.seqs and c["seqs"] == args.seqs), None)
    dump = prefix.parent / f"{prefix.name}.{first_step + 1}" if first_step is not None else None
    return {"side": side, "flash": flash, "n_seq_max": args.seqs if side == "bench" else args.n_seq_max,
            "n_ubatch": args.ubatch, "n_ctx": args.ctx, "attention": note,
            "step_ir_median": int(statistics.median(steps)) if steps else None, "step_irs": steps,
            "prefill_ir": prefill[0] if prefill else None, "calls": len(calls),
            "top_functions_first_step": top_functions(dump) if dump and dump.exists() else []}


def _default_model() -> str:
    from backend.model_file import default_model_path

    return default_model_path()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ggml-cpu-dir", required=True, help="folder with a libggml-cpu.so.0 built without AVX-512")
    ap.add_argument("--case", action="append", required=True,
                    help="side:flash (repeatable): side engine (LlamaBackend, batched-bench's batches), "
                    "scheduler (the real Engine schedules the same prompts) or bench; flash on|off|auto")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--n-seq-max", type=int, default=16)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--model", default=None)
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once")
    ap.add_argument("--out", default=None, help="append the results to this JSON file")
    args = ap.parse_args()
    env = dict(os.environ, LD_LIBRARY_PATH=f"{args.ggml_cpu_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    def one(case: str) -> dict:
        side, _, flash = case.partition(":")
        r = run_case(side, flash or "auto", args, Path(tmp), env)
        print(json.dumps({k: v for k, v in r.items() if k != "top_functions_first_step"}), flush=True)
        return r

    with tempfile.TemporaryDirectory(prefix="cg28-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, args.case))
    if args.out:
        path = Path(args.out)
        data = json.loads(path.read_text()) if path.exists() else {"runs": []}
        data["runs"].append({"config": {k: v for k, v in vars(args).items() if k not in ("case", "out")},
                             "results": results})
        path.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
