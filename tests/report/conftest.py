"""Fixtures for report tests: a tiny hand-computed run and synthetic runs with a known straggler."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace.run import Manifest, RunWriter

MS = 1_000_000


def write_tiny_run(out: Path) -> Path:
    """3 ranks × 4 steps. Step s lasts 100 + 10·s ms on every rank; one all-reduce per step where
    rank 0 arrives at +50 ms, rank 1 at +52 ms, rank 2 (last) at +60 ms and all leave at +70 ms.

    Hand-computed: median step 115 ms, p95 128.5 ms, CV 0.097, skew 10 ms per instance, skew wait per
    rank-step (10 + 8 + 0) / 3 = 6 ms = 5.2 % of the mean step, last arriver rank 2 in 4/4 instances.
    """
    w = RunWriter(out, Manifest(source="test", world_size=3, nodes=1, gpus_per_node=3))
    starts = [0, 100, 210, 330]
    durs = [100, 110, 120, 130]
    for r in range(3):
        w.write(
            "steps",
            {
                "rank": [r] * 4,
                "step": [0, 1, 2, 3],
                "t_start_ns": [s * MS for s in starts],
                "t_end_ns": [(s + d) * MS for s, d in zip(starts, durs, strict=True)],
                "compute_ns": [(50 + 2 * r + (8 if r == 2 else 0)) * MS] * 4,
                "wait_ns": [(20 - [0, 2, 10][r]) * MS] * 4,
                "comm_ns": [(20 - [0, 2, 10][r]) * MS] * 4,
                "data_ns": [0] * 4,
                "gc_ns": [0] * 4,
                "paced_ns": [0] * 4,
                "samples": [32] * 4,
            },
            rank=r,
        )
        enter = [50, 52, 60][r]
        w.write(
            "collectives",
            {
                "rank": [r] * 4,
                "step": [0, 1, 2, 3],
                "seq": [0, 1, 2, 3],
                "group": ["dp"] * 4,
                "op": ["all_reduce"] * 4,
                "bytes": [1 << 20] * 4,
                "t_enter_ns": [(s + enter) * MS for s in starts],
                "t_exit_ns": [(s + 70) * MS for s in starts],
            },
            rank=r,
        )
    w.write(
        "ranks",
        {
            "rank": [0, 1, 2],
            "node": [0, 0, 0],
            "local_rank": [0, 1, 2],
            "host": ["h0"] * 3,
            "leaf": [0] * 3,
            "dp_rank": [0, 1, 2],
            "pp_stage": [None] * 3,
            "tp_rank": [None] * 3,
            "numa": [0] * 3,
            "gpu": ["0", "1", "2"],
            "nic": [None] * 3,
            "clock_offset_ns": [0] * 3,
            "clock_err_ns": [1000] * 3,
        },
    )
    w.close()
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_run(tmp_path_factory.mktemp("tiny") / "tiny")
