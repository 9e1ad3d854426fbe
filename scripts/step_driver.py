"""Runs identical multi-sequence decode steps through this project's LlamaBackend (for callgrind)."""

# Run under `valgrind --tool=callgrind` by scripts/callgrind_compare.py: it builds the backend the
# way the app does (backend.factory.build_backend with the app's sizes) and submits the rows
# llama-batched-bench submits (one batch of every sequence's distinct prompt, then steps of one row
# per sequence, each asking for logits), or lets the real Engine schedule them (`--via engine`).
# It writes the shape of every llama_decode call in order, so that callgrind's per-call dumps can
# be matched to the rows they ran.

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.factory import BackendConfig, build_backend, reset_kv  # noqa: E402
from magnitude_bench.common import prompt_tokens
from scheduler.types import BatchPlan, SeqSlice  # noqa: E402


class Recorder:
    """A backend view that notes each decode's rows (and their first position) before it runs."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self.calls: list[dict] = []

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def decode(self, plan: BatchPlan):
        self.calls.append({"rows": plan.n_rows, "seqs": len(plan.slices),
                           "logit_rows": sum(1 + s.n_draft for s in plan.slices if s.want_logits),
                           "pos_max": max(s.pos0 + len(s.tokens) - 1 for s in plan.slices)})
        return self._backend.decode(plan)


def direct(view: Recorder, prompts: list[tuple[int, ...]], steps: int) -> None:
    """What llama-batched-bench does for one width: all prompts in one batch, then `steps` steps."""
    view.decode(BatchPlan(0, tuple(SeqSlice(s, 0, p, True, False) for s, p in enumerate(prompts)),
                          sum(map(len, prompts))))
    token = prompts[0][0]
    for i in range(steps):
        pos = len(prompts[0]) + i
        view.decode(BatchPlan(0, tuple(SeqSlice(s, pos, (token,), True, True) for s in range(len(prompts))),
                              len(prompts)))


def through_engine(view: Recorder, prompts: list[tuple[int, ...]], steps: int, policy: str, spec: str) -> None:
    """The real Engine schedules the same prompts (as `bench throughput` does)."""
    from magnitude_bench.throughput import engine_run
    from scheduler.speculation import parse_spec_mode

    engine_run(view, prompts, steps, policy, spec=parse_spec_mode(spec))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--via", choices=("backend", "engine"), default="backend")
    ap.add_argument("--flash", choices=("auto", "on", "off"), default="off")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=8192)  # the app's default context
    ap.add_argument("--n-seq-max", type=int, default=16)  # the app's default
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--policy", default="fixed:2048")
    ap.add_argument("--spec", default="off")
    ap.add_argument("--model", default=None)
    ap.add_argument("--shapes-out", required=True)
    args = ap.parse_args()
    # device "cpu": what "auto" resolves to on a machine without a GPU, without listing devices.
    backend = build_backend(BackendConfig("llama", model=args.model, device="cpu", n_ctx=args.ctx,
                                          n_seq_max=args.n_seq_max, n_batch=args.batch,
                                          n_ubatch=args.ubatch, n_threads=args.threads,
                                          flash_attn=args.flash))
    view = Recorder(backend)
    prompts = [prompt_tokens(backend, args.prompt, salt=i + 1) for i in range(args.seqs)]
    reset_kv(backend)
    try:
        if args.via == "backend":
            direct(view, prompts, args.steps)
        else:
            through_engine(view, prompts, args.steps, args.policy, args.spec)
    finally:
        Path(args.shapes_out).write_text(json.dumps({"attention": backend.attention.summary(),
                                                     "n_ctx": backend.n_ctx, "calls": view.calls}))
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
