"""backend.usable_cpus: the thread count a backend starts by default follows the CPUs this process
may use (affinity, cgroup quota), not the host's count."""

from __future__ import annotations

import os

from backend import usable_cpus


def test_usable_cpus_follows_affinity_and_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    assert usable_cpus(tmp_path / "absent") == affinity
    quota.write_text("max 100000\n")
    assert usable_cpus(quota) == affinity  # no quota
    quota.write_text("150000 100000\n")  # 1.5 CPUs: two threads may run
    assert usable_cpus(quota) == min(affinity, 2)
    quota.write_text("10000 100000\n")  # a tenth of a CPU still runs one thread
    assert usable_cpus(quota) == 1
    quota.write_text("garbage\n")
    assert usable_cpus(quota) == affinity


def test_usable_cpus_is_capped_by_the_affinity_mask():
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cpus() == 1
    finally:
        os.sched_setaffinity(0, before)
