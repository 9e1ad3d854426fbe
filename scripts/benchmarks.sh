#!/usr/bin/env bash
# Runs every benchmark once, in the order docs/BENCHMARKS.md shows them, into one folder, then
# rebuilds docs/BENCHMARKS.md's generated part and its plots from that folder.
#
#   bash scripts/benchmarks.sh [OUT_DIR]      (default: results/full-<timestamp>)
#
# Needs `bash scripts/setup.sh` (the venv) and, for the throughput peers, `bash
# scripts/build_llama_tools.sh`. Takes ~45 minutes on 2 cores; each measurement waits for the
# machine to be quiet (other processes under a quarter of a core) and is repeated if disturbed.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/full-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
bench() { echo "+ magnitude-tui bench $*" | tee -a "$out/commands.txt"; .venv/bin/magnitude-tui bench "$@" --out "$out"; }
: > "$out/commands.txt"
bench admit -b simulated:rx9070xt -b llama
bench prefill-curve
bench throughput --require-tools --profile
bench fork
bench ui --threads 2,1
# Depth: subagents forked from a long conversation, and target:MS deep in a context. One engine
# thread timed in CPU seconds, so a busy machine costs wall time but does not decide the ratios.
bench burst -p target-v1:50 -p target:50 -p prefill-first --flash on,off --threads 1 --cpu-clock
bench target-depth --threads 1 --cpu-clock
.venv/bin/python scripts/benchmarks_report.py "$out"
