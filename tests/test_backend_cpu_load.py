"""backend/cpu_load.py: other processes' CPU from a fake /proc (the machine's busy time less this
process, its parent and the pids it is told to leave out)."""

from __future__ import annotations

import os

from backend.cpu_load import CpuLoad

HZ = os.sysconf("SC_CLK_TCK")


class FakeProc:
    """A /proc with a stat file and per-process stat files, all in whole seconds of CPU."""

    def __init__(self, root, n_cpus: int = 2) -> None:
        self.root, self.n_cpus = root, n_cpus
        self.wall, self.own = 0.0, 0.0
        self.machine(busy_s=0, guest_s=0)

    def machine(self, busy_s: int, guest_s: int = 0, per_cpu_s: tuple[int, ...] = ()) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice: guest time is inside user.
        busy = list(per_cpu_s) + [0] * (self.n_cpus - len(per_cpu_s))
        cpus = "".join(f"cpu{i} {busy[i] * HZ} 0 0 {25 * HZ} {HZ} 0 0 0 0 0\n" for i in range(self.n_cpus))
        (self.root / "stat").write_text(f"cpu  {busy_s * HZ} 0 0 {50 * HZ} {3 * HZ} 0 0 0 {guest_s * HZ} 0\n"
                                        + cpus)

    def process(self, pid: int, cpu_s: int, children_s: int = 0) -> None:
        (self.root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", "1"] + ["0"] * 9 + [str(cpu_s * HZ), "0", str(children_s * HZ), "0"] + ["0"] * 5
        (self.root / str(pid) / "stat").write_text(f"{pid} (a (tricky) name) " + " ".join(fields) + "\n")

    def load(self, **kw) -> CpuLoad:
        return CpuLoad(proc=str(self.root), own_cpu_s=lambda: self.own, wall=lambda: self.wall, **kw)


def test_the_parent_and_the_given_pids_are_not_other_processes(tmp_path) -> None:
    proc = FakeProc(tmp_path)
    for pid in (77, 101, 102, 500):
        proc.process(pid, 0)
    plain = proc.load()
    left_out = proc.load(exclude_parent=True, exclude_pids=(101, 102), ppid=lambda: 77)
    # 10 s: the machine busy for 30 core-seconds; this process 4, its parent 6, the helpers 3 + 2
    # (one of them through a reaped child), a neighbour (pid 500) the other 15.
    proc.wall, proc.own = 10.0, 4.0
    proc.machine(busy_s=30)
    proc.process(77, 6)
    proc.process(101, 1, children_s=2)
    proc.process(102, 2)
    proc.process(500, 15)
    assert abs(plain.others() - 2.6) < 1e-6
    assert abs(left_out.others() - 1.5) < 1e-6


def test_a_left_out_process_that_exited_counts_nothing_and_init_is_never_the_parent(tmp_path) -> None:
    proc = FakeProc(tmp_path)
    orphan = proc.load(exclude_parent=True, exclude_pids=(4242,), ppid=lambda: 1)
    proc.process(1, 0)
    proc.wall = 10.0
    proc.machine(busy_s=10)
    proc.process(1, 5)  # init's time is other processes' time
    assert abs(orphan.others() - 1.0) < 1e-6


def test_readings_are_since_the_previous_one_or_since_the_start(tmp_path) -> None:
    proc = FakeProc(tmp_path)
    load = proc.load()
    proc.wall = 10.0
    proc.machine(busy_s=10)
    assert abs(load.others() - 1.0) < 1e-6
    proc.wall = 20.0
    proc.machine(busy_s=30, guest_s=5)  # guest time is counted once (inside user), not twice
    assert abs(load.others() - 2.0) < 1e-6
    assert abs(load.others(since_start=True) - 1.5) < 1e-6
    assert load.others() is None  # no time passed


def test_unknown_without_proc_stat_or_with_more_cpus_than_usable(tmp_path) -> None:
    proc = FakeProc(tmp_path, n_cpus=4)
    assert CpuLoad(proc=str(tmp_path / "missing")).others() is None
    assert not CpuLoad(proc=str(tmp_path / "missing")).readable
    proc.wall = 10.0
    limited = proc.load(usable=2)
    assert not limited.readable and limited.others() is None
    assert proc.load(usable=4).readable and proc.load().readable  # no usable count: no check


def test_given_cores_only_their_busy_time_counts(tmp_path) -> None:
    # A process pinned to cpu1 (taskset, a cpuset): a neighbour busy on cpu0 is not in its way.
    proc = FakeProc(tmp_path, n_cpus=2)
    mine = proc.load(cores={1})
    whole = proc.load()
    proc.wall, proc.own = 10.0, 6.0
    proc.machine(busy_s=16, per_cpu_s=(9, 7))  # cpu0: a neighbour's 9 s; cpu1: ours 6 s and 1 s more
    assert abs(whole.others() - 1.0) < 1e-6
    assert abs(mine.others() - 0.1) < 1e-6
    assert proc.load(cores={5}).others() is None  # a core /proc/stat does not list: unknown


def test_the_probe_counts_the_cores_this_process_may_use_where_they_are_fewer(monkeypatch) -> None:
    from backend import cpu_load

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2})
    assert cpu_load.own_cores() == {2}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cpu_load.own_cores() is None


def test_the_real_proc_can_be_read() -> None:
    load = CpuLoad(exclude_parent=True, own_children=True)
    assert load.readable and load.others(since_start=True) >= 0.0
