"""Helpers for the observer tests: free ports and launching real gloo ranks as subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(
    script: Path, args: list[str], *, world: int, env: dict[str, str] | None = None, timeout: float = 150
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``world`` real ranks of ``script`` (gloo over loopback) and wait for all of them."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e.update(env or {})
        e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()  # only the processes this helper started
            out, err = p.communicate()
            raise AssertionError(f"rank {rank} timed out; stderr tail:\n{err[-3000:]}") from None
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


@pytest.fixture(scope="session")
def launcher():
    """(launch_ranks, free_port): the test modules cannot import conftest under importlib mode."""
    return launch_ranks, free_port


@pytest.fixture
def gloo_world1():
    """A real one-rank gloo process group (DDP with world size 1) for the duration of a test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
