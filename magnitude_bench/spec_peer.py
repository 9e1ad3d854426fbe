"""Provides the `bench spec` peer: the vendored llama-server without speculation and with its own
n-gram speculation (`--spec-type ngram-simple`), on the same tasks, prompts and widths."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from backend.factory import BackendConfig
from magnitude_bench.common import loaded
from magnitude_bench.peers import PeerError, Server, model_path, tools_dir
from magnitude_bench.spec_tasks import Task, task_messages
from scheduler.stats import median, rnd

# llama-server's speculation types compared: none, and its n-gram lookup over the slot's own tokens.
SPEC_TYPES = ("none", "ngram-simple")


def supported_spec_types(bindir: Path) -> list[str]:
    """The --spec-type values this llama-server build lists (empty: it has no such option)."""
    try:
        text = subprocess.run([str(bindir / "llama-server"), "--help"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    line = next((l for l in text.splitlines() if l.strip().startswith("--spec-type")), "")
    return [t for t in line.split(None, 1)[-1].split(",") if t] if line else []


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _burst(server: Server, prompts: list[list[int]], n_predict: int) -> tuple[list[dict], float]:
    """All prompts at once (the slots keep them cached; EOS ends a reply); the replies and the
    server's CPU seconds."""
    assert server.pid is not None  # a started server
    cpu0 = _cpu_s(server.pid)
    replies = server.replies(prompts, n_predict, ignore_eos=False, cache_prompt=True)
    return replies, _cpu_s(server.pid) - cpu0


def run_peer(spec: BackendConfig, cfg, lengths: dict, progress) -> list[dict]:
    """Rows per task, width and spec type; a row saying why when the build cannot run it."""
    found = tools_dir()
    if found is None:
        return [{"task": "-", "seqs": None, "spec_type": "-", "note": "llama-server not built "
                 "(scripts/build_llama_tools.sh)"}]
    bindir, _ = found
    have = supported_spec_types(bindir)
    model = model_path(spec.model)
    with loaded(BackendConfig("llama", model=model, device="cpu", n_ctx=256, n_seq_max=1, flash_attn="off")) as vocab:
        prompts = {t: [vocab.tokenize_chat(task_messages(Task(t), i)) for i in range(max(cfg.widths))]
                   for t in cfg.tasks}
    width = max(cfg.widths)
    rows: list[dict[str, Any]] = []
    for kind in SPEC_TYPES:
        if kind not in have:
            rows.append({"task": "-", "seqs": None, "spec_type": kind,
                         "note": f"this llama-server build has no --spec-type {kind}"})
            continue
        server = Server.on_cpu(bindir, model=model, parallel=width, threads=spec.n_threads or 1,
                               n_ctx=width * 1024, extra=["--spec-type", kind])
        try:
            with server:
                for task in cfg.tasks:
                    for w in cfg.widths:
                        _burst(server, prompts[task][:w], 1)  # the prompts become each slot's cache
                        replies, cpu = _burst(server, prompts[task][:w], cfg.reply_tokens(Task(task)))
                        rows.append(_row(task, w, kind, replies, cpu))
                        progress(f"llama-server {kind} {task} x{w}: {rows[-1]['agg_tok_cpu_s']} tok per CPU s")
        except (PeerError, OSError) as exc:
            rows.append({"task": "-", "seqs": None, "spec_type": kind, "note": f"llama-server failed: {exc}"})
    none = {(r["task"], r["seqs"]): r for r in rows if r["spec_type"] == "none" and r.get("agg_tok_cpu_s")}
    for r in rows:
        base = none.get((r["task"], r["seqs"]))
        if base and r.get("agg_tok_cpu_s"):
            r["x_none_agg"] = rnd(r["agg_tok_cpu_s"] / base["agg_tok_cpu_s"], 3)
            r["x_none_per_seq"] = rnd(r["per_seq_tok_s"] / base["per_seq_tok_s"], 3)
    return rows


def _row(task: str, w: int, kind: str, replies: list[dict], cpu: float) -> dict:
    timings = [r.get("timings", {}) for r in replies]
    made = sum(int(t.get("predicted_n", 0)) for t in timings)
    drafted = sum(int(t.get("draft_n", 0) or 0) for t in timings)
    accepted = sum(int(t.get("draft_n_accepted", 0) or 0) for t in timings)
    return {"task": task, "seqs": w, "spec_type": kind,
            "per_seq_tok_s": rnd(median(float(t.get("predicted_per_second", 0.0)) for t in timings), 2),
            "agg_tok_cpu_s": rnd(made / cpu, 2) if cpu > 0 else None,
            "acceptance": rnd(accepted / drafted, 3) if drafted else None, "tokens": made}
