"""Fixtures for pacing tests: synthetic window summaries and the real-rank benchmark worker."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fabricpace.run.window import WindowSummary

ROOT = Path(__file__).resolve().parents[2]


def make_summaries(
    window: int,
    world: int = 4,
    *,
    step_ms: float = 100.0,
    std_ms: float = 1.0,
    steps: int = 50,
    compute_ms: float | list[float] = 60.0,
    samples: float | list[float] = 16.0,
    gc_ms: float | list[float] = 0.0,
    gc_count: float | list[float] = 0.0,
    last: list[float] | None = None,
    transfer_ms: float = 10.0,
    wait_ms: float = 5.0,
    rss: float = 1e9,
) -> list[WindowSummary]:
    """One window of summaries as the observer would all-gather them."""
    comp = compute_ms if isinstance(compute_ms, list) else [compute_ms] * world
    samp = samples if isinstance(samples, list) else [samples] * world
    lasts = last if last is not None else [10.0] * world
    gms = gc_ms if isinstance(gc_ms, list) else [gc_ms] * world
    gcount = gc_count if isinstance(gc_count, list) else [gc_count] * world
    out = []
    for r in range(world):
        out.append(
            WindowSummary(
                rank=r,
                window=window,
                first_step=window * steps,
                steps=steps,
                step_mean_ns=step_ms * 1e6,
                step_median_ns=step_ms * 1e6,
                step_std_ns=std_ms * 1e6,
                compute_median_ns=comp[r] * 1e6,
                compute_per_sample_ns=comp[r] * 1e6 / samp[r],
                wait_mean_ns=wait_ms * 1e6,
                comm_mean_ns=wait_ms * 1e6,
                transfer_mean_ns=transfer_ms * 1e6,
                last_arrivals=lasts[r],
                collectives=float(sum(lasts)),
                data_mean_ns=0.0,
                gc_mean_ns=gms[r] * 1e6,
                gc_count=gcount[r],
                paced_mean_ns=0.0,
                samples_mean=samp[r],
                rss_bytes=rss,
            )
        )
    return out


@pytest.fixture
def summaries():
    return make_summaries


@pytest.fixture(scope="session")
def bench() -> Any:
    """benchmarks/pacing_real.py as a module: its worker is the real gloo workload the tests run."""
    path = ROOT / "benchmarks" / "pacing_real.py"
    spec = importlib.util.spec_from_file_location("fp_pacing_real", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fp_pacing_real"] = mod
    spec.loader.exec_module(mod)
    return mod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_ranks(script: Path, args: list[str], *, world: int, local_world: int,
                 timeout: float = 240) -> list[subprocess.CompletedProcess[str]]:
    """Run ``world`` real ranks of ``script`` (gloo over loopback) as torchrun would start them, each
    told that ``local_world`` ranks share its host (LOCAL_WORLD_SIZE; the fabric lab says 1)."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % local_world),
                   LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    done = []
    for rank, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()  # only the processes started here
            out, err = p.communicate()
            raise AssertionError(f"rank {rank} timed out; stderr tail:\n{err[-3000:]}") from None
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.fixture(scope="session")
def launch():
    """``launch_ranks`` (test modules cannot import conftest under importlib mode)."""
    return launch_ranks
