"""Provides CpuLoad: how many cores other processes keep busy, read from /proc. The one reader of it
for the engine's thread governor, the attention probe (backend/attention.py) and the benchmarks'
contention meter (magnitude_bench/common.py)."""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable

# One sample: (wall seconds, the machine's busy CPU seconds, the left-out processes' CPU seconds).
Sample = tuple[float, float, float]


def own_cores() -> set[int] | None:
    """The cores this process may run on (taskset, a cpuset), where that is fewer than the
    machine has; else None (all of them)."""
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return None
    return mine if len(mine) < (os.cpu_count() or 0) else None


def _own_cpu_s(children: bool) -> Callable[[], float]:
    n = 4 if children else 2  # user, system[, reaped children's user, system]
    return lambda: sum(os.times()[:n])


class CpuLoad:
    """How many cores other processes used: the machine's busy time from /proc/stat less the CPU
    time of this process and of the processes it is told to leave out (`exclude_parent`: the one
    that started this one; `exclude_pids`: helpers of ours). A left-out process that cannot be read
    (it exited) counts nothing.

    `others()` is None where that cannot be known: no /proc/stat, or, given `usable`, a /proc/stat
    that counts another number of CPUs than this process may use (a CPU-limited container, where
    the machine's busy time is not this process's neighbours'). `own_children` counts this
    process's reaped children as its own (their whole CPU time arrives when they are reaped, so a
    reader that samples every second leaves it out). `cores` counts the busy time of those CPUs
    only (their `cpuN` lines): where this process may run on some of the machine's cores, what
    others do on the rest does not slow it."""

    def __init__(self, usable: int | None = None, *, cores: Iterable[int] | None = None, exclude_parent: bool = False,
                 exclude_pids: Iterable[int] = (), own_children: bool = False, proc: str = "/proc",
                 own_cpu_s: Callable[[], float] | None = None, ppid: Callable[[], int] = os.getppid,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.usable = usable
        self.cores = None if cores is None else frozenset(f"cpu{c}" for c in cores)
        self.exclude_parent = exclude_parent
        self.exclude_pids = tuple(exclude_pids)
        self.proc = proc
        self._own = own_cpu_s or _own_cpu_s(own_children)
        self._ppid = ppid
        self._wall = wall
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._first = self._last = self._read()

    @property
    def readable(self) -> bool:
        """Whether the first reading could be taken."""
        return self._first is not None

    def _ticks(self, pid: int) -> int:
        """CPU ticks `pid` and its reaped children used; 0 where it cannot be read."""
        try:
            with open(f"{self.proc}/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            return sum(int(x) for x in st[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            return 0

    def _read(self) -> Sample | None:
        try:
            with open(f"{self.proc}/stat") as f:
                text = f.read()
        except OSError:
            return None
        lines = text.splitlines()
        if self.usable is not None:
            n_cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
            if n_cpus != self.usable:
                return None
        rows = [line for line in lines if line.split(" ", 1)[0] in self.cores] if self.cores else lines[:1]
        if not rows:
            return None
        busy_ticks = 0
        for row in rows:
            try:
                fields = [int(x) for x in row.split()[1:]]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
            except (IndexError, ValueError):
                return None
            busy_ticks += sum(fields[:8]) - idle  # guest time is already inside user
        left_out = sum(self._ticks(pid) for pid in self.exclude_pids)
        if self.exclude_parent:
            parent = self._ppid()
            left_out += self._ticks(parent) if parent > 1 else 0
        return self._wall(), busy_ticks / self._hz, self._own() + left_out / self._hz

    def others(self, *, since_start: bool = False) -> float | None:
        """Cores other processes used since the previous call (`since_start`: since this reader was
        made); None: unknown."""
        now = self._read()
        last = self._first if since_start else self._last
        self._last = now
        if now is None or last is None or now[0] - last[0] <= 0:
            return None
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0]))
