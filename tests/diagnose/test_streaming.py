"""The collectives table is streamed in chunks of steps: results must not depend on the chunk size,
also when one collective instance carries different step numbers on different ranks (the chunk
boundary must not split it), and must equal the in-memory path."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fabricpace.diagnose import DiagnoseConfig, diagnose
from fabricpace.diagnose.metrics import build_metrics
from fabricpace.run import load_run
from fabricpace.run.reader import StepChunks
from fabricpace.run.schema import COLLECTIVE_COLUMNS
from fabricpace.run.writer import to_table, write_table_atomic

BUCKETS = 4
RANKS = 8


def _relabelled(src: Path, out: Path) -> Path:
    """A copy of ``src`` whose collectives are written per rank in parts of 7 steps (as the observer
    writes them, so row groups straddle chunk boundaries), where the odd ranks count the last bucket of
    every step in the next step, rank 1 counts step 30's last bucket three steps later (more than one
    chunk boundary away at 3 steps a chunk), and the steps table has no wait_ns (so the per-rank wait
    comes from the streamed arrivals)."""
    shutil.copytree(src, out)
    shutil.rmtree(out / "collectives")
    coll = load_run(src, tables=("collectives",)).collectives
    last_bucket = (pl.col("seq") % BUCKETS == BUCKETS - 1) & (pl.col("rank") % 2 == 1)
    coll = coll.with_columns(
        pl.when(last_bucket & (pl.col("rank") == 1) & (pl.col("step") == 30))
        .then(pl.col("step") + 3)
        .when(last_bucket)
        .then(pl.col("step") + 1)
        .otherwise(pl.col("step"))
        .alias("step")
    )
    for r in range(RANKS):
        mine = coll.filter(pl.col("rank") == r).sort("seq")
        for part, lo in enumerate(range(0, int(mine["step"].max()) + 1, 7)):
            rows = mine.filter(pl.col("step").is_between(lo, lo + 6))
            cols = {c: rows[c].to_list() for c in COLLECTIVE_COLUMNS}
            path = out / "collectives" / f"rank-{r:05d}" / f"part-{part:06d}.parquet"
            write_table_atomic(path, to_table("collectives", cols))
    steps = pl.read_parquet(out / "steps" / "all" / "part-000000.parquet")
    steps = steps.with_columns(pl.lit(None, dtype=pl.Int64).alias("wait_ns"))
    shutil.rmtree(out / "steps")
    write_table_atomic(out / "steps" / "all" / "part-000000.parquet", to_table("steps", steps.to_dict()))
    return out


@pytest.fixture(scope="module")
def shifted(synth, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    src = synth("stream_src", ranks=RANKS, steps=60, buckets=BUCKETS, slow_ranks=(3,), slow_factor=1.2)
    return _relabelled(src, tmp_path_factory.mktemp("stream") / "shifted")


def test_instances_that_span_steps_are_never_split(shifted: Path) -> None:
    rows_per_step = RANKS * BUCKETS
    table = StepChunks(shifted, columns=COLLECTIVE_COLUMNS)
    assert len(table.step_ranges(3 * rows_per_step)) >= 15
    keys = ["group", "seq"]

    def split(**kw: object) -> int:
        seen = pl.concat(
            [f.select(keys).unique() for _lo, _hi, f in table.chunks(3 * rows_per_step, **kw)]  # type: ignore[arg-type]
        )
        return int(seen.is_duplicated().sum())

    assert split() > 0  # without keeping instances whole, a plain step filter splits them
    assert split(whole=keys) > 0  # rank 1's step-30 bucket lies beyond a one-step carry ...
    assert split(whole=keys, carry_steps=4) == 0  # ... and a wider carry keeps it whole
    total = sum(f.height for _lo, _hi, f in table.chunks(3 * rows_per_step, whole=keys))
    assert total == load_run(shifted, tables=("collectives",)).collectives.height


def test_chunk_size_does_not_change_the_diagnosis(shifted: Path) -> None:
    calls: list[tuple[int, int]] = []
    small = DiagnoseConfig(chunk_rows=3 * RANKS * BUCKETS)
    streamed = diagnose([shifted], config=small, chunk_progress=lambda _p, d, t: calls.append((d, t)))
    whole = diagnose([shifted], config=DiagnoseConfig(chunk_rows=10**9))
    assert calls[-1][0] == calls[-1][1] >= 15  # really read in many chunks (and said so)
    a, b = streamed.to_dict(), whole.to_dict()
    assert a == b
    assert any(f["mode"] == "persistent_straggler" and f["culprits"]["ranks"] == [3] for f in a["findings"])


def test_streamed_metrics_equal_the_in_memory_path(shifted: Path) -> None:
    cfg = DiagnoseConfig(chunk_rows=3 * RANKS * BUCKETS)
    lazy = build_metrics(
        load_run(shifted, tables=("ranks", "steps")), cfg, collectives=StepChunks(shifted, categorical=True)
    )
    eager = build_metrics(load_run(shifted), cfg)
    assert lazy.instances is not None and eager.instances is not None
    assert lazy.instances.equals(eager.instances)
    assert lazy.instances.filter(pl.col("n") != RANKS).height == 0  # every instance whole
    assert lazy.lateness is not None and eager.lateness is not None and lazy.work is not None
    assert np.array_equal(lazy.lateness, eager.lateness, equal_nan=True)
    assert np.array_equal(lazy.work, eager.work, equal_nan=True)  # from the streamed wait sums
    assert np.array_equal(lazy.ranks, eager.ranks) and np.array_equal(lazy.steps, eager.steps)


def test_cli_progress_on_stderr_json_alone_on_stdout(cli, shifted: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws its bar as on a terminal
    monkeypatch.setenv("COLUMNS", "200")
    rows = 3 * RANKS * BUCKETS
    r = cli("diagnose", str(shifted), "--format", "json", "--chunk-rows", str(rows))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)  # nothing but the JSON on stdout
    n = len(StepChunks(shifted).step_ranges(rows))
    assert "collectives chunks" in r.stderr and f"{n}/{n}" in r.stderr  # the bar counts the chunks
    assert d == diagnose([shifted]).to_dict()
    bad = cli("diagnose", str(shifted), "--chunk-rows", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--chunk-rows" in bad.stderr
