"""A rank's wait per step, from the collectives alone (imports without a wait column): overlapping
collectives count once, whether the table is read whole or in chunks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl

from fabricpace.diagnose import DiagnoseConfig
from fabricpace.diagnose.metrics import build_metrics
from fabricpace.run import load_run
from fabricpace.run.reader import StepChunks
from fabricpace.run.writer import to_table, write_table_atomic

RANKS, BUCKETS = 8, 4


def _without_wait(src: Path, out: Path) -> Path:
    shutil.copytree(src, out)
    steps = pl.concat([pl.read_parquet(p) for p in sorted((out / "steps").rglob("*.parquet"))])
    steps = steps.with_columns(pl.lit(None, dtype=pl.Int64).alias("wait_ns"))
    shutil.rmtree(out / "steps")
    write_table_atomic(out / "steps" / "all" / "part-000000.parquet", to_table("steps", steps.to_dict()))
    return out


def _union_by_hand(coll: pl.DataFrame) -> dict[tuple[int, int], float]:
    """Each rank-step's merged [t_enter, last arrival of that instance] intervals, by a plain loop."""
    last = coll.group_by("group", "seq").agg(pl.col("t_enter_ns").max().alias("last"))
    rows = coll.join(last, on=["group", "seq"]).sort("rank", "step", "t_enter_ns")
    out: dict[tuple[int, int], float] = {}
    for (rank, step), g in rows.group_by("rank", "step", maintain_order=True):
        total, end = 0.0, -np.inf
        for a, b in zip(g["t_enter_ns"].to_list(), g["last"].to_list(), strict=True):
            if b > end:
                total += b - max(a, end)
                end = b
        out[(int(rank), int(step))] = total  # type: ignore[call-overload]
    return out


def test_overlapping_bucket_waits_count_once(synth, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Rank 3 computes twice as slowly: its bucket k arrives at 2·k/4 of the fast ranks' compute, so a
    # fast rank's four waits [k/4·c, 2·k/4·c] overlap (their sum, 2.5c, exceeds the whole step).
    src = synth("arr_overlap", ranks=RANKS, steps=40, buckets=BUCKETS, slow_ranks=(3,), slow_factor=2.0,
                jitter=0.0, transfer_ms=1.0, data_ms=0.0)
    run = _without_wait(src, tmp_path / "nowait")
    coll = load_run(run, tables=("collectives",)).collectives
    expected = _union_by_hand(coll)
    for cfg in (DiagnoseConfig(chunk_rows=10**9), DiagnoseConfig(chunk_rows=3 * RANKS * BUCKETS)):
        m = build_metrics(
            load_run(run, tables=("ranks", "steps")), cfg, collectives=StepChunks(run, categorical=True)
        )
        assert m.work is not None
        wait = m.duration - m.work
        for i, rank in enumerate(m.ranks):
            for j, step in enumerate(m.steps):
                assert abs(wait[i, j] - expected[(int(rank), int(step))]) < 1.0
        assert (m.work > 0).all()  # the sum of the overlapping waits left fast ranks negative work
        fast = np.delete(np.arange(RANKS), 3)
        # A fast rank waits from its first bucket (1/4 into its 80 ms compute) to rank 3's last (160 ms).
        assert np.allclose(np.median(wait[fast]), 140e6, rtol=0.02)
        assert np.median(wait[3]) < 1e6
