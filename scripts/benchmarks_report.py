"""Rebuild the generated part of docs/BENCHMARKS.md from one folder of benchmark results.

    python scripts/benchmarks_report.py results/full-<timestamp>

Everything in docs/BENCHMARKS.md above the MARKER line is written by hand (what the numbers mean)
and kept; everything below it is replaced: the commands that ran, the machine, and each benchmark's
tables and notes, with its plot copied to docs/benchmarks/<name>.png.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

MARKER = "<!-- generated below by scripts/benchmarks_report.py: do not edit by hand -->"
ORDER = ("admit", "prefill-curve", "throughput", "fork", "ui", "burst", "target-depth")
ROOT = Path(__file__).resolve().parents[1]


def latest(folder: Path, name: str) -> Path | None:
    found = sorted(folder.glob(f"{name}-[0-9]*.json"))
    return found[-1] if found else None


def body(md: str) -> str:
    """A result's Markdown without its title and its trailing JSON config, headings one level down."""
    md = re.sub(r"\n```\n\{.*?\n```\n?", "\n", md, flags=re.S)
    lines = md.strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    return "\n".join(("#" + ln) if ln.startswith("## ") else ln for ln in lines).strip()


def machine_line(m: dict) -> str:
    return (f"{m.get('cpu', '?')} ({m.get('simd', '')}), {m.get('cpu_count')} cores, "
            f"{m.get('memory_gib')} GiB, {m.get('os')}, Python {m.get('python')}, "
            f"llama-cpp-python {m.get('llama_cpp_python')}")


def main(folder: Path) -> None:
    doc = ROOT / "docs" / "BENCHMARKS.md"
    plots = ROOT / "docs" / "benchmarks"
    plots.mkdir(parents=True, exist_ok=True)
    head = doc.read_text().split(MARKER)[0].rstrip() if doc.exists() else "# Benchmarks"
    out = [head, "", MARKER, ""]
    commands = folder / "commands.txt"
    if commands.exists():
        out += ["## The run", "", f"Results folder: `{folder.name}`. Commands, in order:", "", "```",
                commands.read_text().strip(), "```", ""]
    machine_done = False
    for name in ORDER:
        js = latest(folder, name)
        if js is None:
            out += [f"## bench {name}", "", "_not in this run_", ""]
            continue
        data = json.loads(js.read_text())
        if not machine_done and data.get("machine"):
            out += [f"Machine: {machine_line(data['machine'])}.", ""]
            machine_done = True
        title = data.get("title") or f"bench {name}"
        out += [f"## {title}", "", f"From `{js.name}`.", ""]
        md = js.with_suffix(".md")
        if md.exists():
            out += [body(md.read_text()), ""]
        png = js.with_suffix(".png")
        if png.exists():
            shutil.copyfile(png, plots / f"{name}.png")
            out += [f"![{name}](benchmarks/{name}.png)", ""]
    doc.write_text("\n".join(out).rstrip() + "\n")
    print(f"wrote {doc.relative_to(ROOT)} and plots under {plots.relative_to(ROOT)}/")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python scripts/benchmarks_report.py RESULTS_FOLDER")
    main(Path(sys.argv[1]))
