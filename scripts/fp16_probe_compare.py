"""The attention probe on two builds of ggml's CPU backend: the installed one and another, alternating.

Where -march=native turns AVX512-FP16 on, ggml's half-precision vectors take 128 elements a step
and run every shorter vector scalar; the CPU flash-attention kernel accumulates each cell's V row
(one head wide) in such a vector. scripts/lib.sh builds without it; this script measures what
that changes, with the probe the app runs at start (backend/attention.py), in fresh processes.

Pass --ggml-cpu-dir, a folder holding a libggml-cpu.so.0 built from the same llama.cpp source with
the other flags (for the build with AVX512-FP16: the flags in BUILD-INFO without -mno-avx512fp16;
see docs/BENCHMARKS.md); it is put first on LD_LIBRARY_PATH for that side only. Each round runs
both sides, in alternating order, each with an empty attention cache (nothing is kept).

  .venv/bin/python scripts/fp16_probe_compare.py --ggml-cpu-dir /tmp/fp16/lib --label avx512fp16 \
      --rounds 3 --threads 1 --out-dir docs/benchmarks
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.attention import PathTiming, decide  # noqa: E402
from magnitude_bench.common import machine_info  # noqa: E402

STEPS = {"fill": "fill_ms", "decode_shallow": "decode_shallow_ms", "decode_deep_shared": "decode_deep_ms",
         "chunk_deep": "chunk_deep_ms", "decode_mixed": "decode_mixed_ms"}

PROBE = """
import json, sys
from backend.factory import BackendConfig, build_backend
b = build_backend(BackendConfig('llama', device='cpu', n_threads=int(sys.argv[1])))
a = b.attention
print(json.dumps({"summary": a.summary(), "others_cores": a.others_cores,
                  "timings": [dict(vars(t), reference_ms=t.reference_ms) for t in a.timings]}))
"""


def probe_once(threads: int, lib_dir: str | None) -> dict:
    env = dict(os.environ)
    if lib_dir:
        env["LD_LIBRARY_PATH"] = lib_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    with tempfile.TemporaryDirectory() as cache:
        env["MAGNITUDE_ATTENTION_CACHE"] = cache
        out = subprocess.run([sys.executable, "-c", PROBE, str(threads)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def build_flags() -> str:
    stamp = ROOT / ".venv/llama-cpp-python.cpu_flags"
    return stamp.read_text().strip() if stamp.exists() else "(no stamp)"


def summarise(runs: list[dict], what: str, command: str, build: str) -> dict:
    def median(flash: bool, key: str) -> float:
        return round(statistics.median(next(t for t in r["timings"] if t["flash"] == flash)[key] for r in runs), 1)

    timings = {name: {**{s: median(flash, k) for s, k in STEPS.items()}, "reference": median(flash, "reference_ms")}
               for name, flash in (("flash_on", True), ("flash_off", False))}
    # The app's own rule on the medians (DENSE_MARGIN included).
    choice = decide(tuple(PathTiming(flash, **{k: median(flash, k) for k in STEPS.values()})
                          for flash in (True, False)), key={})
    verdict = choice.summary() + "; each probe's own: " + ", ".join(r["summary"].split(":", 1)[0] for r in runs)
    return {"issue": 28, "what": what, "build": build, "command": command,
            "machine": {"cpu": machine_info().get("cpu", platform.machine()), "cores": os.cpu_count(),
                        "loadavg_at_write": list(os.getloadavg())},
            "timings_ms": timings, "verdict": f"{verdict} (medians of {len(runs)} fresh probes)",
            "runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-cpu-dir", required=True, help="folder with the other build's libggml-cpu.so.0")
    ap.add_argument("--label", required=True, help="what the other build has (a file name part)")
    ap.add_argument("--other-flags", default="", help="the flags the other build was made with (recorded)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "docs/benchmarks")
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    sides = {"installed": None, args.label: args.ggml_cpu_dir}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    order = list(sides)
    for i in range(args.rounds):
        for name in (order if i % 2 == 0 else order[::-1]):
            r = probe_once(args.threads, sides[name])
            print(f"round {i + 1} {name}: {r['summary']}", flush=True)
            runs[name].append(r)
    command = "python " + shlex.join([Path(sys.argv[0]).as_posix()] + sys.argv[1:])
    base = (f"attention probe (backend/attention.py measure_path), SmolLM2-135M-Instruct Q4_1, CPU, "
            f"{args.threads} thread{'s' if args.threads > 1 else ''}, n_ubatch 512, fresh process and empty cache each; "
            "one-thread steps timed in CPU time of the process, medians of 3 within a probe")
    for name in sides:
        build = build_flags() if name == "installed" else args.other_flags or args.label
        doc = summarise(runs[name], f"{base}; ggml-cpu built with {build}", command, build)
        doc["run"] = {"started": started, "command": command}
        path = args.out_dir / f"issue28-probe-{'no-' if name == 'installed' else ''}{args.label}-{args.threads}t.json"
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{path}: {doc['verdict']}")


if __name__ == "__main__":
    main()
