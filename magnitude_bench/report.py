"""Provides `magnitude-bench report`: the generated sections of docs/BENCHMARKS.md and
docs/BENCHMARKS-HISTORY.md, rebuilt from the raw results committed under docs/benchmarks/.

A generated section sits between `<!-- generated: KIND KEY... -->` and `<!-- end -->`; KIND names a
renderer (`report_tables.RENDERERS`), each KEY a raw result: `docs/benchmarks/KEY.json`, the latest
`KEY-YYYYMMDD-HHMMSS.json` (what `scripts/benchmarks.sh` copies in), or the file provenance.json's
`aliases` names for KEY (`report_raw.py`). Everything outside the markers is prose and is kept as
written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from magnitude_bench.report_raw import PROVENANCE, RAW_DIR, ROOT, Results
from magnitude_bench.report_tables import RENDERERS

PAGES = (ROOT / "docs" / "BENCHMARKS.md", ROOT / "docs" / "BENCHMARKS-HISTORY.md")
SECTION = re.compile(r"(<!-- generated: (?P<kind>[\w-]+)(?P<keys>(?: [\w.-]+)*) -->\n)(?P<body>.*?)(<!-- end -->)", re.S)


def render(text: str, results: Results) -> str:
    """The page with every generated section rebuilt from `results`."""
    def one(m: re.Match) -> str:
        kind, keys = m["kind"], m["keys"].split()
        if kind not in RENDERERS:
            raise KeyError(f"unknown generated section kind {kind!r} (known: {', '.join(sorted(RENDERERS))})")
        body = RENDERERS[kind](results, *[results.get(k) for k in keys]).strip()
        return f"{m.group(1)}{body}\n{m.group(5)}"

    return SECTION.sub(one, text)


def stale(pages=PAGES, folder: Path = RAW_DIR) -> list[Path]:
    """The pages whose generated sections differ from what the raw results give."""
    results = Results(folder)
    return [p for p in pages if p.exists() and render(p.read_text(), results) != p.read_text()]


def write(pages=PAGES, folder: Path = RAW_DIR) -> list[Path]:
    """Rebuild the pages' generated sections in place; the pages that changed."""
    results = Results(folder)
    changed = []
    for p in pages:
        if not p.exists():
            continue
        new = render(p.read_text(), results)
        if new != p.read_text():
            p.write_text(new)
            changed.append(p)
    return changed


def combine(out: Path, name: str, title: str, runs: list[tuple[Path, str]]) -> Path:
    """One raw result holding several runs, each with its command line (the `--control` passes of
    `bench spec` are read together): written as `out`, returned."""
    doc = {"name": name, "title": title,
           "runs": [json.loads(Path(p).read_text()) | {"command": cmd} for p, cmd in runs]}
    Path(out).write_text(json.dumps(doc, indent=1))
    return Path(out)


def record(file: str, command: str, folder: Path = RAW_DIR) -> None:
    """Note in provenance.json the command that made a raw result, for benches that do not record it."""
    if (json.loads((folder / file).read_text()).get("run") or {}).get("command"):
        return
    prov = folder / PROVENANCE
    doc = json.loads(prov.read_text()) if prov.exists() else {}
    doc[file] = doc.get(file, {}) | {"command": command}
    prov.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


USAGE = """usage: python -m magnitude_bench.report combine OUT NAME TITLE FILE COMMAND [FILE COMMAND ...]
       python -m magnitude_bench.report record FILE COMMAND"""

if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if len(args) >= 6 and args[0] == "combine" and len(args[4:]) % 2 == 0:
        rest = args[4:]
        print(combine(Path(args[1]), args[2], args[3], [(Path(f), cmd) for f, cmd in zip(rest[::2], rest[1::2])]))
    elif len(args) == 3 and args[0] == "record":
        record(args[1], args[2])
    else:
        sys.exit(USAGE)
