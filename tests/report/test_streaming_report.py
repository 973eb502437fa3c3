"""The report reads the collectives chunk by chunk: its numbers must equal the in-memory ones for any
chunk size, also when ranks disagree about which step a collective belongs to."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic
from fabricpace.report import data as rd
from fabricpace.run import load_run
from fabricpace.run.reader import StepChunks
from fabricpace.run.writer import to_table, write_table_atomic


def _run(tmp_path: Path) -> Path:
    spec = SynthSpec(ranks=8, steps=40, buckets=4, slow_ranks=(2,), slow_factor=1.2)
    run = write_synthetic(tmp_path / "r", spec)
    coll = load_run(run, tables=("collectives",)).collectives
    # Odd ranks count each step's last bucket in the next step; parts of 5 steps per rank.
    coll = coll.with_columns(
        pl.when((pl.col("seq") % 4 == 3) & (pl.col("rank") % 2 == 1)).then(pl.col("step") + 1)
        .otherwise(pl.col("step")).alias("step")
    )
    for f in (run / "collectives").rglob("*.parquet"):
        f.unlink()
    for r in range(8):
        mine = coll.filter(pl.col("rank") == r)
        for part, lo in enumerate(range(0, 41, 5)):
            rows = mine.filter(pl.col("step").is_between(lo, lo + 4))
            path = run / "collectives" / f"rank-{r:05d}" / f"part-{part:06d}.parquet"
            write_table_atomic(path, to_table("collectives", rows.to_dict()))
    return run


def test_streamed_stats_equal_in_memory(tmp_path: Path) -> None:
    run = _run(tmp_path)
    eager = rd.collective_stats(load_run(run))
    calls: list[int] = []
    steps_only = load_run(run, tables=("ranks", "steps"))
    lazy = rd.collective_stats(
        StepChunks(run, categorical=True), steps=steps_only.steps, rows_per_chunk=2 * 8 * 4,
        progress=lambda d, _t: calls.append(d),
    )
    assert len(calls) >= 15
    assert lazy.instances.equals(eager.instances)
    assert eager.instances.height == 40 * 4 and (eager.instances["n"] == 8).all()
    key = ["rank", "step"]
    assert lazy.waits.sort(key).equals(eager.waits.sort(key))
    a = rd.summarize(steps_only, "r", lazy)
    b = rd.summarize(load_run(run), "r")
    assert a == b and a.top_last_arriver == 2
    assert rd.breakdown(steps_only, lazy.waits).equals(rd.breakdown(load_run(run)))


def test_waits_cut_a_slice_at_a_time_equal_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The skew waits are cut and joined a slice of whole rank-steps at a time (bounded memory): any
    slice size gives the same numbers, also where the cut applies (collectives in flight longer than
    the rank was blocked, as in this run)."""
    run = load_run(_run(tmp_path))
    steps = run.steps
    assert (steps["comm_ns"] > steps["wait_ns"]).sum() > steps.height // 2
    key = ["rank", "step"]
    whole = rd.collective_stats(run).waits.sort(key)
    for rows in (1, 7, 50):
        monkeypatch.setattr(rd, "_SLICE_ROWS", rows)
        assert rd.collective_stats(run).waits.sort(key).equals(whole), rows
