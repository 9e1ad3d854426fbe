"""Provides the raw results committed under docs/benchmarks/, found by key: `KEY.json`, the newest
`KEY-YYYYMMDD-HHMMSS.json`, or the file provenance.json's `aliases` names for KEY."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAW_DIR = ROOT / "docs" / "benchmarks"
# Commands, dates and notes for raw results written before the benches recorded them, taken from
# the commits that added those files; a result's own fields win over these.
PROVENANCE = "provenance.json"

STAMP = re.compile(r"-(\d{8})-(\d{6})$")


@dataclass(frozen=True)
class Raw:
    """One committed raw result: its file name, its content and what is known of its making."""

    key: str
    file: str
    doc: dict
    provenance: dict

    @property
    def run(self) -> dict:
        """How the run ran (command, git, start, load before and after), where the bench recorded it."""
        return self.doc.get("run") or {}

    @property
    def date(self) -> str:
        started = self.run.get("started")
        if started:
            return started.replace("T", " ")[:16] + " UTC"
        m = STAMP.search(Path(self.file).stem)
        if m:
            d, t = m.groups()
            return f"{d[:4]}-{d[4:6]}-{d[6:]} {t[:2]}:{t[2:4]} UTC"
        return self.provenance.get("date", "?")

    @property
    def command(self) -> str:
        cmd = (self.run.get("command") or (self.doc.get("config") or {}).get("command") or self.doc.get("command")
               or self.provenance.get("command"))
        return normalize_command(cmd) if cmd else "?"


def normalize_command(cmd: str) -> str:
    """The recorded command line as one would type it today: the `magnitude-bench` console script
    (older results recorded `magnitude-tui bench` or a venv path), without `--out`."""
    cmd = re.sub(r"^\S*magnitude-tui bench ", "magnitude-bench ", cmd.strip())
    cmd = re.sub(r"^\S*/magnitude-bench ", "magnitude-bench ", cmd)
    cmd = re.sub(r"^\.venv/bin/python ", "python ", cmd)
    return re.sub(r" --out \S+", "", cmd)


class Results:
    """The raw results of one folder, by key."""

    def __init__(self, folder: Path = RAW_DIR) -> None:
        self.folder = Path(folder)
        prov = self.folder / PROVENANCE
        self._provenance = json.loads(prov.read_text()) if prov.exists() else {}
        self._cache: dict[str, Raw] = {}

    def path(self, key: str) -> Path:
        exact = self.folder / f"{key}.json"
        stamped = sorted(p for p in self.folder.glob(f"{key}-*.json") if STAMP.search(p.stem)
                         and p.stem[:-len("-YYYYmmdd-HHMMSS")] == key)
        if stamped:
            return stamped[-1]
        if exact.exists():
            return exact
        alias = self._provenance.get("aliases", {}).get(key)
        if alias:
            return self.folder / alias
        raise FileNotFoundError(f"no raw result {key}.json or {key}-<timestamp>.json under {self.folder}")

    def get(self, key: str) -> Raw:
        if key not in self._cache:
            p = self.path(key)
            self._cache[key] = Raw(key=key, file=p.name, doc=json.loads(p.read_text()),
                                   provenance=self._provenance.get(p.name, {}))
        return self._cache[key]
