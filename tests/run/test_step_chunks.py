"""StepChunks: the collectives table read a few steps at a time, from real Parquet parts as the
observer (one folder per rank, several parts) and the simulator (one folder, large row groups) write them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fabricpace.run import ChunkWriter, Manifest, load_run, write_manifest
from fabricpace.run.reader import StepChunks
from fabricpace.run.writer import to_table


def _observer_like(
    tmp_path: Path, ranks: int = 3, steps: int = 20, per_part: int = 6, late: int = -1
) -> Path:
    """``ranks`` ranks writing parts of ``per_part`` steps, two buckets a step; rank ``late`` counts
    every collective one step later than the others."""
    tmp_path.mkdir(parents=True, exist_ok=True)  # write_manifest never creates a run directory
    write_manifest(tmp_path, Manifest(source="observer", world_size=ranks, nodes=1, gpus_per_node=ranks))
    for r in range(ranks):
        w = ChunkWriter(tmp_path, "collectives", r)
        for s in range(steps):
            for b in range(2):
                w.append(
                    rank=r, step=s + (r == late), seq=2 * s + b, group="dp", op="all_reduce",
                    bytes=1 << 20, t_enter_ns=1000 * s + 10 * b + r, t_exit_ns=1000 * s + 10 * b + 50,
                )
            if s % per_part == per_part - 1:
                w.flush()
        w.flush()
    return tmp_path


def test_chunks_cover_every_row_once_in_load_run_order(tmp_path: Path) -> None:
    run = _observer_like(tmp_path)
    full = load_run(run, tables=("collectives",)).collectives
    table = StepChunks(run)
    assert table.rows == full.height and table.step_span == (0, 19)
    ranges = table.step_ranges(rows_per_chunk=6 * 4)  # 6 rows a step: 4 steps a chunk
    assert ranges == [(0, 3), (4, 7), (8, 11), (12, 15), (16, 19)]
    parts = [f for _lo, _hi, f in table.chunks(6 * 4)]
    order = ["rank", "seq"]
    assert pl.concat(parts).sort(order).equals(full.sort(order))  # every row once, same (string) columns
    for lo, hi in ranges:  # the same as a filtered load_run, for every range
        want = load_run(run, tables=("collectives",), step_range=(lo, hi)).collectives
        assert table.read(lo, hi).equals(want)
    cat = StepChunks(run, columns=("rank", "step", "group"), categorical=True).read(0, 3)
    assert cat.columns == ["rank", "step", "group"] and cat.schema["group"] == pl.Categorical


def test_instances_held_back_to_the_next_chunk(tmp_path: Path) -> None:
    run = _observer_like(tmp_path, late=2)
    table = StepChunks(run)
    plain = [f.select("group", "seq").unique() for *_r, f in table.chunks(6 * 4)]
    assert pl.concat(plain).is_duplicated().any()  # a plain step filter splits instances
    # Rank 2 counts every collective one step later than the others: held back, never split.
    out = []
    for lo, hi, f in table.chunks(6 * 4, whole=("group", "seq")):
        out.append((lo, hi, f))
    keys = pl.concat([f.select("group", "seq").unique() for *_r, f in out])
    assert not keys.is_duplicated().any()
    # Each chunk but the last hands its last step's instances to the next one (rank 2's rows of
    # step 3 are those of the others' step 2: held back too).
    assert out[0][2]["step"].max() == 2 and out[1][2]["step"].min() == 2
    assert sum(f.height for *_r, f in out) == table.rows


def test_row_groups_without_statistics_and_unreadable_parts(tmp_path: Path) -> None:
    run = _observer_like(tmp_path)
    rows = load_run(run, tables=("collectives",)).collectives.filter(pl.col("rank") == 0)
    folder = run / "collectives" / "rank-00009"
    folder.mkdir()
    # A writer that stores no statistics: the step range is read from the step column instead.
    table = to_table("collectives", {c: rows[c].to_list() for c in rows.columns})
    table = table.set_column(0, "rank", pa.array([9] * table.num_rows, pa.int32()))
    pq.write_table(table, folder / "part-000000.parquet", write_statistics=False, row_group_size=16)
    (folder / "part-000001.parquet").write_bytes(b"PAR1 truncated by a kill")
    chunks = StepChunks(run)
    assert any("part-000001.parquet: unreadable chunk skipped" in w for w in chunks.warnings)
    got = chunks.read(5, 9)
    assert sorted(got.filter(pl.col("rank") == 9)["step"].unique().to_list()) == [5, 6, 7, 8, 9]
    assert got.height == 4 * 2 * 5


def test_not_a_chunked_table() -> None:
    with pytest.raises(ValueError, match="chunked table"):
        StepChunks(".", "ranks")


def test_a_run_dir_whose_name_has_glob_characters_keeps_its_collectives(tmp_path: Path) -> None:
    """`exp[lr=0.1]` is a common run-dir name; read as a glob pattern it matched nothing, so the
    chunked reader saw no collectives (diagnose said 'undecided', the trace export was empty)."""
    run = _observer_like(tmp_path / "exp[lr=0.1]")
    full = load_run(run, tables=("collectives",)).collectives
    chunks = StepChunks(run)
    got = pl.concat([f for _lo, _hi, f in chunks.chunks(1000)])
    assert got.height == full.height == 3 * 20 * 2
