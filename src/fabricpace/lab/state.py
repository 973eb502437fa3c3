"""The lab's state file: everything ``lab up`` and ``lab run`` created, written *before* creating it.

Intent is logged first, so a crash at any point leaves a file that names what may exist; ``lab down``
reads it (and also searches by the lab's name prefix) to remove everything. PIDs are stored with their
kernel start time, so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

STATE_DIR_ENV = "FABRICPACE_LAB_STATE_DIR"
DEFAULT_STATE_DIR = "/run/fabricpace"  # tmpfs: gone after a reboot, exactly like the namespaces


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV, DEFAULT_STATE_DIR))


def state_path(prefix: str) -> Path:
    return state_dir() / f"lab-{prefix.rstrip('-')}.json"


def empty_state() -> dict[str, Any]:
    return {
        "config": None,
        "up_complete": False,
        "netns_mount_preexisting": None,
        "namespaces": [],
        "links": [],
        "cgroups": [],
        "pids": [],
        "shaping": {},
    }


@contextlib.contextmanager
def locked(prefix: str) -> Iterator[dict[str, Any]]:
    """Read-modify-write the state under an exclusive lock; the new state is written atomically."""
    path = state_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(".lock")
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        state = read(prefix) or empty_state()
        try:
            yield state
        finally:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
            os.replace(tmp, path)


def read(prefix: str) -> dict[str, Any] | None:
    """The state, or None when no lab with this prefix was recorded (or the file is unreadable)."""
    path = state_path(prefix)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(raw, dict):
        return None
    merged = empty_state()
    merged.update(raw)
    return merged


def remove(prefix: str) -> None:
    path = state_path(prefix)
    for p in (path, path.with_suffix(".lock")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    if prefix not in _CLAIMS and not claimed_elsewhere(prefix):
        with contextlib.suppress(FileNotFoundError):
            _claim_path(prefix).unlink()


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces/parentheses: fields after the last ')' are fixed.
    return int(stat.rsplit(")", 1)[1].split()[19])


def record_pid(prefix: str, pid: int, what: str) -> None:
    """Remember a process the lab started (so ``lab down`` can end it, and only it)."""
    start = proc_start_time(pid)
    if start is None:
        return
    with locked(prefix) as st:
        st["pids"].append({"pid": pid, "start": start, "what": what})


def forget_pids(prefix: str, pids: list[int]) -> None:
    gone = set(pids)
    with locked(prefix) as st:
        st["pids"] = [p for p in st["pids"] if p["pid"] not in gone]


def record_cgroup(prefix: str, path: str) -> None:
    with locked(prefix) as st:
        if path not in st["cgroups"]:
            st["cgroups"].append(path)


# Run claims this process holds, by prefix. flock conflicts between two open files of one process too,
# so the holder must not test its own claim through a second open.
_CLAIMS: dict[str, IO[str]] = {}


class RunClaimed(Exception):
    """Another process holds the lab's run claim (internal; the launcher turns it into an InputError)."""


def _claim_path(prefix: str) -> Path:
    return state_dir() / f"run-{prefix.rstrip('-')}.lock"


@contextlib.contextmanager
def run_claim(prefix: str) -> Iterator[None]:
    """Hold the lab's run claim for a whole ``lab run``: a second run, or ``lab up`` rebuilding the lab,
    sees it from the first instant, before any rank PID is recorded (checking recorded PIDs alone let
    two runs started together both pass). The kernel drops the lock when the process ends, however."""
    path = _claim_path(prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")  # noqa: SIM115 - held for the with-block's duration
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        fh.close()
        raise RunClaimed(prefix) from exc
    _CLAIMS[prefix] = fh
    try:
        yield
    finally:
        del _CLAIMS[prefix]
        fh.close()  # releases the lock


def claimed_elsewhere(prefix: str) -> bool:
    """True while another process holds the lab's run claim."""
    if prefix in _CLAIMS:
        return False
    path = _claim_path(prefix)
    if not path.exists():
        return False
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False
