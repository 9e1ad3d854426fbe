"""Provides `magnitude-tui generate`: N concurrent sequences through an engine (local or remote),
printed with rich (at full width when stdout is a file or a pipe) or as JSON."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from backend.factory import BackendConfig
from magnitude_tui.engine.client import WorkerClient
from magnitude_tui.engine.events import (
    CommandRejected,
    EngineConfig,
    EngineFailed,
    EngineReady,
    LoadProgress,
    SeqUpdate,
    StepReport,
    ThreadState,
)
from magnitude_tui.engine.protocol import EngineClient, seq_updates
from scheduler.speculation import SpecMode
from scheduler.types import Message, Phase, Request, SamplingParams


def local_client(n_prompts: int, *, model, device, policy, n_ctx, verbose: bool,
                 backend: str = "llama", threads: int | None = None,
                 draft_model: str | None = None, spec: SpecMode = SpecMode.AUTO) -> WorkerClient:
    """The local engine for `generate`: one sequence slot per prompt (at least 16); `threads`
    fixes the CPU thread count (None: the engine chooses it between steps)."""
    config = EngineConfig(BackendConfig(backend, model=model, device=device, n_ctx=n_ctx, n_threads=threads,
                                        n_seq_max=max(16, n_prompts), verbose=verbose,
                                        draft_model=draft_model), policy=policy,
                          auto_threads=threads is None, spec=spec)
    return WorkerClient(config, log_path=None if verbose else "auto")


# Where stdout is not a terminal rich would assume 80 columns and squeeze the table's columns into
# `TT…` and `tok…`; a file gets lines as long as the table needs instead.
FILE_WIDTH = 400


def output_console(*, json_out: bool) -> Console:
    """Where the human-readable output goes: stdout (stderr when stdout carries the JSON), at the
    terminal's width, or unbounded when it is a file or a pipe."""
    console = Console(stderr=json_out)
    if not console.is_terminal:
        console = Console(stderr=json_out, width=FILE_WIDTH)
    return console


class ToolFileError(ValueError):
    """A --json-schema or --tools file that cannot be used; the message names the file and the part."""


def tool_use_from_files(json_schema: Path | None = None, tools: Path | None = None,
                        tool_choice: str | None = None):
    """The ToolUse that `--json-schema FILE`, `--tools FILE` (an OpenAI `tools` array) and
    `--tool-choice` ask for, checked exactly as `serve` checks a body (the same messages)."""
    from magnitude_tui.serve.errors import OpenAIError
    from magnitude_tui.serve.tools_body import parse_tool_use

    body: dict = {}
    for path, key in ((json_schema, "response_format"), (tools, "tools")):
        if path is None:
            continue
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ToolFileError(f"{path}: not a readable JSON file ({e})") from None
        body[key] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": data}} \
            if key == "response_format" else data
    if tool_choice is not None:
        body["tool_choice"] = tool_choice if tool_choice in ("none", "auto", "required") else \
            {"type": "function", "function": {"name": tool_choice}}
    try:
        return parse_tool_use(body)
    except OpenAIError as e:
        source = json_schema if e.param and e.param.startswith("response_format") else tools
        raise ToolFileError(f"{source or '--tool-choice'}: {e.message}") from None


def run_generate(prompts: list[str], client: EngineClient, *, max_tokens, temperature, seed,
                 stream: bool, json_out: bool = False, tool_use=None) -> int:
    """Submit every prompt at once, stream until all are done, print answers and latency (as one
    JSON document on stdout with `json_out`; the progress lines then go to stderr). `tool_use`
    (from `tool_use_from_files`): the tools and schema every request carries; the parsed tool
    calls are printed after the answers."""
    console = output_console(json_out=json_out)
    if not prompts:  # an empty --prompts file, --n 0: say so before loading a model for nothing
        Console(stderr=True).print("[red]no prompts to run[/]: the --prompts file has no non-blank line, "
                                   "or --n is below 1", highlight=False)
        return 2
    client.start()
    try:
        if not _wait_ready(client, console):
            return 1
        sampling = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
        finals: dict[str, SeqUpdate] = {}
        texts: dict[str, str] = {}
        calls: dict[str, dict[int, dict]] = {}  # request id -> call index -> id, name, arguments
        order = []
        for i, p in enumerate(prompts):
            rid = f"gen-{i}"
            order.append(rid)
            texts[rid] = ""
            use = {} if tool_use is None else {"tools": tool_use.tools, "tool_choice": tool_use.tool_choice,
                                               "parallel_tool_calls": tool_use.parallel_tool_calls,
                                               "response_schema": tool_use.response_schema}
            client.submit(Request(request_id=rid, session_id=f"s{i}", messages=(Message("user", p),),
                                  sampling=sampling, **use))
        t0 = time.perf_counter()
        steps = 0
        threads: ThreadState | None = None
        rows = {"steps": 0, "decode": 0, "prefill": 0, "draft": 0, "accepted": 0}
        while len(finals) < len(prompts):
            batch = client.poll_events(timeout=60)
            if batch is None:
                console.print("[red]no progress from the engine for 60 s[/]")
                return 1
            for ev in batch:
                updates = seq_updates([ev])
                if isinstance(ev, StepReport):
                    steps += 1
                    threads = ev.threads or threads
                    rows["steps"] += bool(ev.decode_rows + ev.prefill_rows)
                    rows["decode"] += ev.decode_rows
                    rows["prefill"] += ev.prefill_rows
                    rows["draft"] += ev.draft_rows
                    rows["accepted"] += ev.draft_accepted
                if isinstance(ev, (EngineFailed, CommandRejected)):
                    console.print(f"[red]{escape(ev.message)}[/]")  # it may quote names such as m[q4]
                for u in updates:
                    texts[u.request_id] += u.text_delta
                    _add_calls(calls.setdefault(u.request_id, {}), u)
                    if stream and u.text_delta and not json_out:
                        sys.stdout.write(f"[{u.request_id}] {u.text_delta!r}\n")
                    if u.phase is Phase.DONE:
                        finals[u.request_id] = u
        wall = time.perf_counter() - t0
        if json_out:
            doc = results_json(order, prompts, texts, finals, wall, steps, rows, threads)
            for entry, rid in zip(doc["sequences"], order):
                entry["tool_calls"] = [c for _, c in sorted(calls.get(rid, {}).items())]
            json.dump(doc, sys.stdout, indent=2)
            sys.stdout.write("\n")
            return 0 if all(f.error is None for f in finals.values()) else 1
        _print_results(console, order, prompts, texts, finals, wall, steps, rows)
        _print_calls(console, order, calls)
        if threads is not None:
            console.print(f"CPU threads: {threads.short()}: {threads.why}")
        return 0 if all(f.error is None for f in finals.values()) else 1
    finally:
        client.stop()


def _add_calls(calls: dict[int, dict], u: SeqUpdate) -> None:
    """Put a step's tool-call pieces together: the first names the call, later ones extend its arguments."""
    for d in u.tool_calls:
        call = calls.setdefault(d.index, {"id": d.id, "name": d.name, "arguments": ""})
        call["arguments"] += d.arguments


def _print_calls(console: Console, order: list[str], calls: dict[str, dict[int, dict]]) -> None:
    for i, rid in enumerate(order):
        for _, c in sorted(calls.get(rid, {}).items()):
            console.print(f"[bold]#{i}[/] tool call [cyan]{escape(c['name'] or '')}[/]({escape(c['arguments'])})"
                          f"  [dim]{escape(c['id'] or '')}[/]", highlight=False)


def _wait_ready(client: EngineClient, console: Console) -> bool:
    with Progress(TextColumn("loading {task.fields[model]} on {task.fields[device]}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), console=console, transient=True) as progress:
        task = progress.add_task("load", total=1.0, model="model", device="...")
        while True:
            batch = client.poll_events(timeout=300)
            if batch is None:
                console.print("[red]the engine did not start within 300 s[/]")
                return False
            for ev in batch:
                if isinstance(ev, LoadProgress):
                    progress.update(task, completed=ev.fraction, model=ev.model, device=ev.device)
                elif isinstance(ev, EngineReady):
                    progress.stop()
                    sizes = f", n_ctx={ev.n_ctx}, n_seq_max={ev.n_seq_max}" if ev.n_ctx else ""  # 0: a remote engine
                    console.print(f"[green]ready[/]: {ev.model} on {ev.device}{sizes}, policy={ev.policy}, "
                                  f"spec={ev.spec}")
                    return True
                elif isinstance(ev, EngineFailed):
                    progress.stop()
                    console.print(f"[red]{escape(ev.message)}[/]")  # it may quote a path with brackets
                    return False


def results_json(order, prompts, texts, finals, wall, steps, rows, threads: ThreadState | None) -> dict:
    """What the table says, as data: one entry per sequence and the run's totals."""
    sequences = []
    for i, rid in enumerate(order):
        f = finals[rid]
        sequences.append({
            "index": i, "prompt": prompts[i], "text": texts[rid], "error": f.error,
            "done_reason": f.done_reason.value if f.done_reason else None,
            "prompt_tokens": f.prompt_total, "cached_tokens": f.cached_tokens, "generated_tokens": f.generated,
            "tokens_estimated": f.remote.tokens_estimated, "queue_ms": f.queue_ms, "ttft_ms": f.ttft_ms,
            "tok_s": f.tok_s, "itl_p50_ms": f.itl_p50_ms, "itl_p95_ms": f.itl_p95_ms, "itl_max_ms": f.itl_max_ms,
            "tokens_per_step": f.spec.tokens_per_step, "drafted": f.spec.drafted, "accepted": f.spec.accepted,
            "endpoint": f.remote.endpoint,
        })
    total = sum(finals[rid].generated for rid in order)
    return {"sequences": sequences, "wall_s": wall, "steps": steps,
            "aggregate_tok_s": total / wall if wall > 0 else None,
            "rows": dict(rows) if rows else None,
            "threads": None if threads is None else {"summary": threads.short(), "why": threads.why}}


def _fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def _print_results(console, order, prompts, texts, finals, wall, steps, rows=None) -> None:
    for i, rid in enumerate(order):
        f = finals[rid]
        head = f"[bold]#{i}[/] {prompts[i][:60]!r}"
        body = texts[rid].strip() if f.error is None else f"[red]{f.error}[/]"
        console.print(f"{head}\n  {body}\n")
    remote = any(f.remote.endpoint for f in finals.values())
    if remote:  # the server scheduled; every figure here was measured on the client
        title = f"{len(order)} sequences on {len({f.remote.endpoint for f in finals.values()})} server(s), " \
                f"client-side figures: {wall:.2f} s wall"
    else:
        title = f"{len(order)} sequences in one context: {wall:.2f} s wall, {steps} steps"
    table = Table(title=title)
    cols = ["seq", "prompt (cached)", "generated", "queue ms", "TTFT ms", "tok/s", "ITL p50", "ITL p95", "tok/step",
            "accepted", "end"]
    for col in cols + (["server"] if remote else []):
        table.add_column(col, justify="right")
    total = 0
    for i, rid in enumerate(order):
        f = finals[rid]
        total += f.generated
        mark = "~" if f.remote.tokens_estimated else ""  # counted here with tiktoken: the server sent no usage
        table.add_row(str(i), f"{mark}{f.prompt_total} ({f.cached_tokens})", f"{mark}{f.generated}", _fmt(f.queue_ms),
                      _fmt(f.ttft_ms), _fmt(f.tok_s, ".1f"), _fmt(f.itl_p50_ms, ".1f"), _fmt(f.itl_p95_ms, ".1f"),
                      _fmt(f.spec.tokens_per_step, ".2f"),
                      f"{f.spec.accepted}/{f.spec.drafted}" if f.spec.drafted else "-",
                      f.done_reason.value if f.done_reason else "-", *([f.remote.endpoint or "-"] if remote else []))
    console.print(table)
    if any(f.remote.tokens_estimated for f in finals.values()):
        console.print("~ estimated with tiktoken (cl100k_base): the server sent no usage")
    console.print(f"aggregate: {total / wall:.1f} generated tok/s")
    if rows and rows["steps"]:
        steps, drafted = rows["steps"], rows["draft"]
        share = f", {rows['accepted']}/{drafted} accepted ({100 * rows['accepted'] / drafted:.0f} %)" if drafted else ""
        console.print(f"rows per step: {rows['decode'] / steps:.1f} decode, {rows['prefill'] / steps:.1f} prompt, "
                      f"{drafted / steps:.1f} draft{share}")
