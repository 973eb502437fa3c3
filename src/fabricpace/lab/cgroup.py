"""CPU throttling of chosen ranks with a cgroup v1 CPU quota (``cpu.cfs_quota_us``).

Each throttled rank gets its own cgroup ``/sys/fs/cgroup/cpu/<prefix>lab/<name>``; the path is written to
the lab's state file before it is created, so ``lab down`` removes it even after a crash.
"""

from __future__ import annotations

from pathlib import Path

from fabricpace._errors import LabError
from fabricpace.lab import state

CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 50_000  # shorter than the default 100 ms: a throttled rank is slowed more evenly


def available() -> bool:
    """cgroup v1 cpu controller mounted and writable (root)."""
    return (CGROUP_CPU_ROOT / "cpu.cfs_quota_us").exists() and (CGROUP_CPU_ROOT / "tasks").exists()


def cgroup_root(prefix: str) -> Path:
    return CGROUP_CPU_ROOT / f"{prefix}lab"


def throttle(prefix: str, name: str, pid: int, cpus: float) -> Path:
    """Move process ``pid`` (all its threads) into a cgroup limited to ``cpus`` CPUs (e.g. 0.1)."""
    if not available():
        raise LabError("cgroup v1 cpu controller not found at /sys/fs/cgroup/cpu; cannot throttle ranks")
    if not 0.01 <= cpus <= 64:
        raise LabError(f"throttle cpus {cpus}: choose between 0.01 and 64")
    root = cgroup_root(prefix)
    path = root / name
    state.record_cgroup(prefix, str(root))
    state.record_cgroup(prefix, str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(max(1000, int(cpus * PERIOD_US))))
        (path / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        raise LabError(f"{path}: cannot set a CPU quota ({exc})") from exc
    return path


def throttled_time_ns(path: Path) -> int:
    """Total time the cgroup was throttled (cpu.stat throttled_time), for the run's record."""
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value)
    except OSError:
        return 0
    return 0
