"""A container's CPU limit is a CFS quota that the affinity mask does not show: the thread
budget must follow it, or the workers run more threads than the quota feeds and the whole group
is throttled (seen: 7x fewer steps per second under a 2/3-core quota)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hogwild.replica import resources
from hogwild.replica.resources import available_cores, cgroup_cpu_limit


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_a_v2_quota_is_read_from_the_process_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    _write(proc, "0::/kubepods/pod1/ctr")
    _write(tmp_path / "fs/kubepods/cpu.max", "max 100000")
    _write(tmp_path / "fs/kubepods/pod1/cpu.max", "150000 100000")  # the pod: 1.5 cores
    _write(tmp_path / "fs/kubepods/pod1/ctr/cpu.max", "300000 100000")  # looser than its parent
    assert cgroup_cpu_limit(str(proc), str(tmp_path / "fs")) == pytest.approx(1.5)


def test_a_v1_quota_under_the_cpu_controller_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    _write(proc, "4:memory:/m\n3:cpu,cpuacct:/box\n1:cpuset:/")
    _write(tmp_path / "fs/cpu,cpuacct/box/cpu.cfs_quota_us", "66666")
    _write(tmp_path / "fs/cpu,cpuacct/box/cpu.cfs_period_us", "100000")
    _write(tmp_path / "fs/cpu,cpuacct/cpu.cfs_quota_us", "-1")  # the root: no quota
    _write(tmp_path / "fs/cpu,cpuacct/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_limit(str(proc), str(tmp_path / "fs")) == pytest.approx(0.66666)


@pytest.mark.parametrize("files", [{}, {"cpu.max": "max 100000"}, {"cpu.max": "garbage"}])
def test_no_quota_or_an_unreadable_one_is_no_limit(tmp_path: Path, files: dict[str, str]) -> None:
    proc = tmp_path / "cgroup"
    _write(proc, "0::/")
    for name, text in files.items():
        _write(tmp_path / "fs" / name, text)
    assert cgroup_cpu_limit(str(proc), str(tmp_path / "fs")) is None
    assert cgroup_cpu_limit(str(tmp_path / "missing"), str(tmp_path / "fs")) is None


@pytest.mark.parametrize(("quota", "cores"), [(None, 2), (0.67, 1), (1.5, 1), (2.0, 2), (8.0, 2)])
def test_the_thread_budget_is_the_affinity_capped_by_the_quota_rounded_down(
        monkeypatch: pytest.MonkeyPatch, quota: float | None, cores: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(resources, "cgroup_cpu_limit", lambda: quota)
    assert available_cores() == cores
