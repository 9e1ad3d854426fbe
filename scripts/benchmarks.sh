#!/usr/bin/env bash
# Reproduces every figure on docs/BENCHMARKS.md: runs each bench command that produced a raw result
# on the page into one folder, copies each JSON (and plot) to docs/benchmarks/KEY-<timestamp>.json,
# where the page's generated section KEY reads the newest, and regenerates the page.
#
#   bash scripts/benchmarks.sh [--quick | --history] [OUT_DIR]   (default: results/full-<timestamp>, ...)
#   BENCH_ONLY=resume,fork bash scripts/benchmarks.sh ...   (only the lines with those keys)
#
# --quick runs the lines marked quick: under 20 minutes on 2 quiet cores; --history runs the
# superseded passes docs/BENCHMARKS-HISTORY.md still shows from raw results. The whole list takes
# several hours there (bench spec alone about two). Needs `bash scripts/setup.sh` (the venv) and,
# for the peers, `bash scripts/build_llama_tools.sh`. Each measurement waits for the machine to be
# quiet (MAGNITUDE_BENCH_QUIET_WAIT_S, 60 s) and is repeated if disturbed; on a shared machine
# MAGNITUDE_BENCH_WAIT_QUIET=0 measures at once and records the load instead.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0 mode=full
if [[ "${1:-}" == "--quick" ]]; then quick=1 mode=quick; shift; fi
if [[ "${1:-}" == "--history" ]]; then quick=2 mode=history; shift; fi
out="${1:-results/$mode-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
: > "$out/commands.txt"
last_json=""

# bench quick|full|history KEY ARGS...: one magnitude-bench command into $out; KEY "-" keeps its
# JSON there only. The default runs quick and full lines, --quick the quick ones, --history the rest.
bench() {
    local set=$1 key=$2; shift 2
    if [[ $quick == 1 && $set != quick ]]; then return 0; fi
    if [[ $quick == 2 && $set != history ]] || [[ $quick != 2 && $set == history ]]; then return 0; fi
    if [[ -n "${BENCH_ONLY:-}" && ",$BENCH_ONLY," != *",$key,"* ]]; then return 0; fi
    # The JSON this command writes is the one not in the folder before it ran (a name list, not a
    # marker file's time: a marker removed during an hour-long run ended the script without a word).
    local before; before=$(ls -1 "$out")
    echo "+ magnitude-bench $*" | tee -a "$out/commands.txt"
    .venv/bin/magnitude-bench "$@" --out "$out"
    last_json=$(comm -13 <(echo "$before" | sort) <(ls -1 "$out" | sort) | grep '\.json$' | tail -1 || true)
    if [[ -z "$last_json" ]]; then echo "no JSON from: magnitude-bench $*" >&2; exit 1; fi
    last_json="$out/$last_json"
    if [[ $key == - ]]; then echo "  -> $last_json"; return 0; fi
    local stem; stem=$(basename "$last_json" .json)
    local dest="docs/benchmarks/$key-${stem: -15}"
    cp "$last_json" "$dest.json"
    .venv/bin/python -m magnitude_bench.report record "$(basename "$dest").json" "magnitude-bench $*"
    if [[ -f "${last_json%.json}.png" ]]; then cp "${last_json%.json}.png" "$dest.png"; fi
    echo "  -> $last_json, copied to $dest.json"
}

# Keypress to screen and the engine step with the app attached, 8 panes on the real model.
bench quick ui ui --threads 1 --reps 1 --keys 20
# Warm resume: one engine thread, the first reply after --resume, cold vs warm.
bench quick resume resume --history 2000 --reps 3 --threads 1
# Throughput against llama.cpp's tools (issue 28's peers), one thread, alternating repetitions.
bench quick throughput throughput --seqs 8 --gen 32 --reps 2 -p target:50 --peers batched-bench,server --require-tools --threads 1
# Issue 28's acceptance: 1, 8 and 16 sequences at 1 and 2 threads, the engine with the app's
# defaults (--spec auto, thread governor) and with them off.
bench full throughput-sweep-1t throughput --seqs 1,8,16 --gen 32 --reps 5 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 1
bench full throughput-sweep-2t throughput --seqs 1,8,16 --gen 32 --reps 5 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 2
# The same widths at one thread with each peer at the same time, a core each (swapped every
# repetition): the ratios from the same minutes, which the sweeps' drift leaves unresolved.
bench full throughput-paired-1t throughput --seqs 1,8,16 --gen 64 --reps 4 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 1 --paired
# Two threads in longer runs and nearly twice the repetitions: how far apart runs of the same work
# land at two threads on a two-core machine, where a pair would need four cores.
bench full throughput-sweep-2t-long throughput --seqs 1,8,16 --gen 64 --reps 9 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 2
# Width 1 alone in eleven alternating repetitions, where five leave the sweeps' medians within this
# machine's noise of each other (a process runs its native steps at one of two speeds).
bench full throughput-width1-1t throughput --seqs 1 --gen 32 --reps 11 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 1
bench full throughput-width1-2t throughput --seqs 1 --gen 32 --reps 11 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 2
# The same with the engine on the peers' attention path (flash), where the measured choice differs.
bench full throughput-sweep-1t-flash throughput --seqs 1,8,16 --gen 32 --reps 5 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 1 --flash-attn on
bench full throughput-sweep-2t-flash throughput --seqs 1,8,16 --gen 32 --reps 5 -p target:50 -p target:50+defaults --peers batched-bench,server --require-tools --threads 2 --flash-attn on
# HTTP clients against serve and llama-server; this app on llama-server against the local engine.
bench quick serve serve --seqs 8 --gen 32 --reps 2 --parts clients --threads 1
bench quick remote remote --llama-server 8 --local --seqs 8 --gen 32 --reps 2 --device cpu --threads 1
# Subagents forked from a long parent against the same prompts cold.
bench quick fork fork --threads 1
# One long prompt arriving while 8 sequences generate, on the simulated RX 9070 XT (seconds).
bench quick admit admit -b simulated:rx9070xt
# A person's prompt beside generating agents (simulated: seconds).
bench quick person-cpu2core person --backend simulated:cpu2core
bench quick person-cpu2core-deep person --backend simulated:cpu2core-deep
# Structured output against free text and llama-server.
bench quick structured structured --seqs 1,8,16 --max-tokens 48 --reps 6
# The agent trace against llama-server (small: the full trace needs hours per side here).
bench quick agents-2-no-bursts agents --bursts off --agents 2 --turns 2 --k-max 300 --think-scale 0.5 --reps 4 --sides serve,llama-server,llama-server+reuse+ram,llama-server+fa-off,llama-server+serve-prompts
# The same without cutting the tool results (the trace's K of 100-3,000 tokens): about 15 minutes.
bench full agents-2-no-bursts-full agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --sides serve,llama-server,llama-server+reuse+ram,llama-server+fa-off
# ... with every reply run to its max_tokens on every side (the same decode work on each).
bench full agents-2-no-bursts-full-exact agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --exact-replies --sides serve,llama-server,llama-server+reuse+ram
bench full agents-2-no-bursts-full-exact-same-prompts agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 2 --exact-replies --sides serve,llama-server,llama-server+serve-prompts
# ... serve and llama-server at once, on a core each (swapped every repetition): each repetition's
# ratio from the same minutes of a machine whose speed drifts more than the gap between the sides.
bench full agents-2-no-bursts-full-exact-paired agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --exact-replies --sides serve,llama-server --paired
# ... eight repetitions: the four-repetition runs' medians moved by more than the work between them.
bench full agents-2-no-bursts-full-exact-paired-8 agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 8 --exact-replies --sides serve,llama-server --paired
# ... llama-server paired with itself without -kvu (a cache stream per slot): what the layout is worth.
bench full agents-2-no-bursts-full-exact-paired-peer-streams agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --exact-replies --sides llama-server,llama-server+streams --paired
# ... serve with a KV stream per sequence (--kv-streams: each agent's rows read only its own cells),
# against llama-server as the issue configures it (unified KV), and against llama-server without
# -kvu (its own default for -np given; outside the issue's configurations, reported beside them).
bench full agents-2-no-bursts-full-exact-paired-streams agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 8 --exact-replies --sides serve+streams,llama-server --paired
# ... four agents, each stream 8,192 cells (--ctx 32768 on both sides: a history of two whole turns
# outgrows 4,096): more of the pool is other agents' cells.
bench full agents-4-no-bursts-full-exact-paired-streams agents --bursts off --agents 4 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --exact-replies --ctx 32768 --sides serve+streams,llama-server --paired
bench full agents-2-no-bursts-full-exact-paired-streams-both agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 4 --exact-replies --sides serve+streams,llama-server+streams --paired
bench full agents-2-bursts agents --bursts on --agents 2 --turns 2 --k-max 300 --think-scale 0.5 --reps 2
# The burst line at 10 slots, three repetitions against llama-server with and without --cache-reuse
# (its -fa off ran 1.8-1.9x their makespan in the runs before and never led: left out for time).
bench full agents-4-bursts agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 3 --sides serve,llama-server,llama-server+reuse
# ... paired with llama-server's best side on it (--cache-reuse 256), every reply to its max_tokens:
# both at once on a core each, swapped every repetition, so a ratio is not the machine's drift.
bench full agents-4-bursts-paired agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 4 --exact-replies --sides serve,llama-server+reuse --paired
# What a unified KV cache's span costs a decode row (the burst trace's subagents decode deep in a shared
# pool): a prompt per sequence, one shared prompt, and a cache stream per sequence.
bench full kv-span kv-span --prompt 1000 --seqs 5 --gen 24 --reps 2 --threads 1
# ... and llama-server sent serve's own rendering of each history (the same prompt tokens), beside both.
bench full agents-4-bursts-same-prompts agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 2 --sides serve,llama-server,llama-server+serve-prompts
# The same trace on serve as the app launches it (its probe's attention path) and on flash attention asked for.
bench full agents-4-bursts-paths agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 2 --sides serve,serve+fa-on
# ... and with speculation off (the app's default is --spec auto).
bench full agents-4-bursts-spec agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 2 --sides serve,serve+spec-off
# The trace without bursts, whole tool results, on serve as launched and on flash attention asked for.
bench full agents-2-no-bursts-full-paths agents --bursts off --agents 2 --turns 2 --k-max 3000 --think-scale 0.5 --reps 2 --sides serve,serve+fa-on,llama-server,llama-server+reuse+ram
bench full agents-4-bursts-np20 agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 4 --parallel 20 --sides serve,llama-server,llama-server+serve-prompts
# ... paired at 20 slots with llama-server --cache-reuse 256, every reply to its max_tokens, as the
# 10-slot paired line runs.
bench full agents-4-bursts-np20-paired agents --bursts on --agents 4 --turns 2 --k-max 300 --think-scale 0.5 --reps 4 --parallel 20 --exact-replies --sides serve,llama-server+reuse --paired
# The burst line on the trace as generated (whole tool results, K of 100-3,000 tokens), 20 slots, the
# sides in turn, every reply to its max_tokens. At 32,768 cells llama-server's slots, each holding
# its own copy of a parent's history, run out of cells in the bursts and their calls fail (about 25
# minutes); at 65,536 every call of both sides is answered (about 50 minutes).
bench full agents-4-bursts-full-32k agents --bursts on --agents 4 --turns 2 --k-max 3000 --think-scale 0.5 --reps 1 --parallel 20 --ctx 32768 --exact-replies --sides serve,llama-server+reuse+ram,llama-server+reuse
bench full agents-4-bursts-full agents --bursts on --agents 4 --turns 2 --k-max 3000 --think-scale 0.5 --reps 2 --parallel 20 --ctx 65536 --exact-replies --sides serve,llama-server+reuse
# Speculative decoding: the matrix (about 75 minutes), the width 16 with a control, the model as
# its own draft with llama-server's n-gram speculation beside it (about 20), then the control runs.
bench full spec-reps3 spec --reps 3 --modes off,ngram,auto --no-peer
bench full spec-width16 spec --seqs 16 --modes off,auto --control --reps 2 --no-peer
bench full spec-draft-peer spec --seqs 1,2,4,8 --modes off,draft --reps 1
# Superseded passes the history page shows (2026-12-01 and 2026-12-02 code; today's code differs).
bench history spec-natural spec --tasks repetitive --seqs 1,2,4 --modes off,ngram,auto --reps 1 --no-peer
bench history spec-natural-quoting-chat spec --tasks quoting,chat --seqs 4,16 --modes off,auto --reps 2 --no-peer
bench history spec-flash spec --tasks repetitive --seqs 1,2,4 --modes off,ngram,auto --reps 3 --no-peer --max-tokens 64
bench history spec-dense spec --tasks repetitive --seqs 1,2,4 --modes off,ngram,auto --reps 3 --no-peer --max-tokens 64 --flash-attn off
bench history spec-matrix spec --tasks repetitive,quoting,chat --seqs 1,2,4,8,16 --modes off,ngram,auto --reps 2 --no-peer --max-tokens 48
if [[ $quick == 0 && ( -z "${BENCH_ONLY:-}" || ",$BENCH_ONLY," == *",spec-control,"* ) ]]; then
    control=()
    for args in "--tasks repetitive --seqs 16 --modes off,auto --control --reps 2 --no-peer" \
                "--tasks quoting,chat --seqs 8,16 --modes off,auto --control --reps 2 --no-peer" \
                "--tasks quoting,chat --seqs 8,16 --modes off,auto --control --reps 4 --no-peer"; do
        # shellcheck disable=SC2086
        BENCH_ONLY="" bench full - spec $args
        control+=("$last_json" "magnitude-bench spec $args")
    done
    .venv/bin/python -m magnitude_bench.report combine "docs/benchmarks/spec-control-$(date +%Y%m%d-%H%M%S).json" \
        spec-control "bench spec --control: the cells in doubt with off run twice in each repetition" "${control[@]}"
fi
# Not rerun here: docs/benchmarks/issue28-attention-probe.json (the probe's timings, printed by the
# command in that file), issue28-callgrind.json (scripts/callgrind_compare.py, 30+ minutes under
# valgrind with an AVX2 build of ggml-cpu: see docs/BENCHMARKS.md), and
# issue28-probe-avx512fp16-1t.json with issue28-probe-no-avx512fp16-1t.json
# (scripts/fp16_probe_compare.py, with a ggml-cpu built with AVX512-FP16 beside this one).

.venv/bin/magnitude-bench report
echo "raw results: $out (commands in $out/commands.txt); copied into docs/benchmarks/:"
git status --short docs/benchmarks docs/BENCHMARKS.md docs/BENCHMARKS-HISTORY.md
