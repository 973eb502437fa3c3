"""Fixtures for importer tests: small synthetic Kineto jobs written in the real trace layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace.importers.synthetic import SyntheticJob, write_job

SMALL = SyntheticJob(world_size=4, steps=6, kernels_per_step=8, slow_rank=2, slow_factor=1.3, seed=7)


@pytest.fixture(scope="session")
def small_job() -> SyntheticJob:
    """The job the kineto_* fixtures hold."""
    return SMALL


@pytest.fixture(scope="session")
def kineto_gz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four gzip traces with distributedInfo; rank 2 computes 30% slower."""
    folder = tmp_path_factory.mktemp("kineto_gz")
    write_job(folder, SMALL, gz=True)
    return folder


@pytest.fixture(scope="session")
def kineto_plain_noinfo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job as plain .json without distributedInfo: ranks only in the file names."""
    folder = tmp_path_factory.mktemp("kineto_noinfo")
    write_job(folder, SMALL, gz=False, distributed_info=False, name="trace_rank-{rank}.pt.trace.json")
    return folder


def write_whatif(folder: Path, *, relative: bool = False, slow: tuple[int, int] = (1, 1)) -> Path:
    """A What-if trace (OSDI'25 artifact layout): dp 2 × pp 2 × tp 2 = 8 ranks, 4 steps, 2 micro-batches.

    Every op of a worker runs back to back; worker ``slow`` (dp_rank, stage) computes 1.5× longer, so it
    arrives last at its stage's grads-reduce-scatter. Both TP ranks of a worker record the same ops.
    ``relative``: start_ts restarts at 0 every step (as some traces do).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: dict[str, list] = {
        k: []
        for k in (
            "dp_rank",
            "stage",
            "rank",
            "tp_rank",
            "step",
            "optype",
            "start_ts",
            "duration",
            "seq_id",
            "mc",
            "gmc",
            "mb_id",
        )
    }

    def add(dp: int, st: int, step: int, op: str, t: float, d: float, seq: int, mb: int | None) -> None:
        for tp in range(2):
            rows["dp_rank"].append(dp)
            rows["stage"].append(st)
            rows["rank"].append(st * 4 + dp * 2 + tp)
            rows["tp_rank"].append(tp)
            rows["step"].append(step)
            rows["optype"].append(op)
            rows["start_ts"].append(t)
            rows["duration"].append(d)
            rows["seq_id"].append(seq)
            rows["mc"].append(0)
            rows["gmc"].append(st)
            rows["mb_id"].append(mb)

    for step in range(4):
        base = 0.0 if relative else 10.0 + step * 1.0
        arrive: dict[tuple[int, int], float] = {}
        for dp in range(2):
            for st in range(2):
                f = 1.5 if (dp, st) == slow else 1.0
                t = base
                for mb in range(2):
                    if st == 1:
                        add(dp, st, step, "forward-recv", t, 0.01, mb, None)
                        t += 0.01
                    add(dp, st, step, "forward-compute", t, 0.05 * f, mb, mb)
                    t += 0.05 * f
                    if st == 0:
                        add(dp, st, step, "forward-send", t, 0.005, mb, None)
                        t += 0.005
                for mb in range(2):
                    if st == 0:
                        add(dp, st, step, "backward-recv", t, 0.01, mb, None)
                        t += 0.01
                    add(dp, st, step, "backward-compute", t, 0.1 * f, mb, mb)
                    t += 0.1 * f
                    if st == 1:
                        add(dp, st, step, "backward-send", t, 0.005, mb, None)
                        t += 0.005
                arrive[(dp, st)] = t
        for dp in range(2):
            for st in range(2):
                t = arrive[(dp, st)]
                end = max(arrive[(0, st)], arrive[(1, st)]) + 0.02
                add(dp, st, step, "grads-reduce-scatter", t, end - t, 0, None)
                add(dp, st, step, "optimizer", end, 0.03, 0, None)
                add(dp, st, step, "optimizer-clip-main-grad", end, 0.01, 0, None)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trace-T.parquet"
    pq.write_table(pa.table(rows), path)
    (folder / "meta-T.yaml").write_text(
        "trial_name: T\nrun_id: 0\ndp_size: 2\ndsp_size: 1\npp_size: 2\ntp_size: 2\n"
        "vpp_size: 1\nworld_size: 8\n"
    )
    return path


@pytest.fixture(scope="session")
def whatif_writer():  # type: ignore[no-untyped-def]
    """The What-if trace writer (tests call it with their own options)."""
    return write_whatif
