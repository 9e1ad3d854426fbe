#!/usr/bin/env bash
# Runs every benchmark once, in the order docs/BENCHMARKS.md shows them, into one folder, then
# rebuilds docs/BENCHMARKS.md's generated part and its plots from that folder.
#
#   bash scripts/benchmarks.sh [OUT_DIR]      (default: results/full-<timestamp>)
#
# Needs `bash scripts/setup.sh` (the venv) and, for the throughput peers, `bash
# scripts/build_llama_tools.sh`. Takes about three hours on 2 cores; each measurement waits for the
# machine to be quiet (other processes under a quarter of a core) and is repeated if disturbed.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/full-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
bench() { echo "+ magnitude-bench $*" | tee -a "$out/commands.txt"; .venv/bin/magnitude-bench "$@" --out "$out"; }
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
bench resume --history 2000 --reps 3 --threads 1
# Other programs: OpenAI clients against `serve` (llama-server beside it), this app on a server.
bench serve --seqs 1,4,8,16 --gen 32 --agents 16
bench remote --llama-server 8 --local --seqs 1,4,8 --gen 32 --device cpu
# Each task at its own reply length (the rewrite runs to ~400 tokens), off run twice in each
# repetition to show what identical work reads (about 75 minutes); then the model as its own
# draft and llama-server's n-gram speculation at 1-8 sequences (draft at 16 alone takes ~30).
bench spec --reps 3 --modes off,ngram,auto --control --no-peer
bench spec --seqs 1,2,4,8 --modes off,draft --reps 1
# Busy processes on purpose: run last, and read the figures as ratios.
bench contention --reps 1
.venv/bin/python scripts/benchmarks_report.py "$out"
