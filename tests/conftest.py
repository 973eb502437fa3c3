"""Shared fixtures: temporary run directories and a CLI runner with fabricpace's exit-code contract."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the real ``fabricpace`` entry point in a subprocess (exit codes and stderr as users see them)."""
    return subprocess.run(
        [sys.executable, "-m", "fabricpace.cli.app", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def one_line_refusal(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert the bad-input contract — exit 2, no traceback, one stderr line that starts with
    "fabricpace: error: " and holds every needle — and return that line."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabricpace: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def refused():
    """``one_line_refusal`` (test modules cannot import conftest under importlib mode)."""
    return one_line_refusal


def gpipe_whatif(folder: Path, *, dp: int = 2, pp: int = 2, mbs: int = 4, steps: int = 6,
                 slow: tuple[int, int] | None = None, jitter: float = 0.0, data_load: float = 0.0,
                 relative: bool = False, seed: int = 0) -> Path:
    """A What-if trace (``trace-job1.parquet`` + ``meta-job1.yaml``) of a GPipe job: dp × pp workers,
    ``mbs`` micro-batches, blocking forward/backward sends and receives between neighbouring stages,
    continuous absolute seconds — so the last stage ends its backward first and starts step s+1 while
    stage 0 still finishes step s (the import audit 16's whatif/gen.py). ``slow`` = (dp_rank, stage):
    that worker's forwards take 1.5× longer; ``jitter``: compute times × U(1 ± jitter); ``data_load``:
    seconds of data loading at each step's start; ``relative``: every step's times restart at 0."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    f, b, x, opt = 0.010, 0.020, 0.001, 0.004
    rows: list[dict[str, object]] = []
    t = {(d, s): 0.0 for d in range(dp) for s in range(pp)}
    base = dict(t)

    def add(d: int, s: int, step: int, op: str, t0: float, dur: float, seq: int = 0) -> None:
        rows.append(dict(dp_rank=d, stage=s, rank=s * dp + d, step=step, optype=op,
                         start_ts=t0 - (base[d, s] if relative else 0.0), duration=dur, seq_id=seq,
                         mc=0, gmc=0, mb_id=seq))

    def noisy(v: float) -> float:
        return v * rng.uniform(1 - jitter, 1 + jitter) if jitter else v

    for step in range(steps):
        base = dict(t)
        for d in range(dp):
            if data_load:
                for s in range(pp):
                    add(d, s, step, "data-load", t[d, s], data_load)
                    t[d, s] += data_load
            for m in range(mbs):
                for s in range(pp):
                    if s > 0:
                        end = max(t[d, s - 1], t[d, s]) + x
                        add(d, s - 1, step, "forward-send", t[d, s - 1], end - t[d, s - 1], m)
                        add(d, s, step, "forward-recv", t[d, s], end - t[d, s], m)
                        t[d, s - 1] = t[d, s] = end
                    ff = noisy(f * (1.5 if (d, s) == slow else 1.0))
                    add(d, s, step, "forward-compute", t[d, s], ff, m)
                    t[d, s] += ff
            for m in range(mbs):
                for s in reversed(range(pp)):
                    if s < pp - 1:
                        end = max(t[d, s + 1], t[d, s]) + x
                        add(d, s + 1, step, "backward-send", t[d, s + 1], end - t[d, s + 1], m)
                        add(d, s, step, "backward-recv", t[d, s], end - t[d, s], m)
                        t[d, s + 1] = t[d, s] = end
                    bb = noisy(b)
                    add(d, s, step, "backward-compute", t[d, s], bb, m)
                    t[d, s] += bb
        for s in range(pp):
            last = max(t[d, s] for d in range(dp))
            for d in range(dp):
                add(d, s, step, "grads-reduce-scatter", t[d, s], last + 0.003 - t[d, s])
                t[d, s] = last + 0.003
        for k in t:
            add(*k, step, "optimizer", t[k], opt)
            t[k] += opt
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "trace-job1.parquet")
    (folder / "meta-job1.yaml").write_text(
        f"trial_name: job1\ndp_size: {dp}\npp_size: {pp}\ntp_size: 1\ndsp_size: 1\nvpp_size: 1\n"
        f"world_size: {dp * pp}\n")
    return folder


@pytest.fixture
def gpipe():
    """``gpipe_whatif`` (test modules cannot import conftest under importlib mode)."""
    return gpipe_whatif


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_gloo_ranks(script: Path, args: list[str], *, world: int, local_world: int | None = None,
                      env: dict[str, str] | None = None,
                      timeout: float = 150) -> list[subprocess.CompletedProcess[str]]:
    """Run ``world`` real ranks of ``script`` (gloo over loopback) as torchrun would start them and wait
    for all of them; each is told that ``local_world`` ranks share its host (LOCAL_WORLD_SIZE; default:
    all of them; the fabric lab says 1). ``env`` is added to each rank's environment."""
    local_world = local_world or world
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ)
        e.update(env or {})
        e.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % local_world),
                 LOCAL_WORLD_SIZE=str(local_world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
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
def gloo_ranks():
    """(launch_gloo_ranks, free_port) for the conftests below (importlib mode: no conftest imports)."""
    return launch_gloo_ranks, free_port
