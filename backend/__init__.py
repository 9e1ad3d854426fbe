"""backend package: the only code that touches llama_cpp (llama_load.py, llama_backend.py, native.py
and their helpers), and the fake and simulated stand-ins. This module itself imports nothing heavy."""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """CPUs this process may actually use: its affinity mask, capped by a cgroup v2 CPU quota.

    os.cpu_count() is the host's count; in a container limited to 2 CPUs on a 64-core host, ggml
    would start 64 spinning threads on 2 cores."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, n)


def model_path_problem(path: str) -> str | None:
    """What is wrong with a --model path before llama.cpp sees it (None: a readable file)."""
    if os.path.isdir(path):
        ggufs = sorted(p.name for p in Path(path).glob("*.gguf"))[:3]
        hint = f" (it holds {', '.join(ggufs)})" if ggufs else ""
        return f"model path is a directory, not a GGUF file: {path}{hint}; pass the .gguf file itself"
    if not os.path.exists(path):
        return f"model file not found: {path}"
    if not os.access(path, os.R_OK):
        return f"model file is not readable: {path}; check its permissions"
    return None
