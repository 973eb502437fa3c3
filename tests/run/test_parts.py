"""Merged part files (run/parts.py): names, which files hold the rows, and a merge cut short."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fabricpace.run.parts import live_parts, merge_parts, part_span


def test_part_names():
    assert part_span("part-000012.parquet") == (12, 12)
    assert part_span("part-000000-000063.parquet") == (0, 63)
    assert part_span("part-000063-000000.parquet") is None  # a range that runs backwards
    assert part_span(".part-000001.parquet.7.tmp") is None and part_span("ranks.parquet") is None


def test_a_merged_part_supersedes_the_parts_it_covers():
    names = ["part-000064.parquet", "part-000000-000063.parquet", "part-000003.parquet",
             "part-000063.parquet", "notes.txt", "part-000065.parquet"]
    assert live_parts(names) == [(0, 63, "part-000000-000063.parquet"), (64, 64, "part-000064.parquet"),
                                 (65, 65, "part-000065.parquet")]
    # nested merges (a larger range over smaller ones) keep the larger only
    assert [n for *_, n in live_parts(["part-000000-000003.parquet", "part-000000-000015.parquet",
                                       "part-000004-000007.parquet", "part-000016.parquet"])] == [
        "part-000000-000015.parquet", "part-000016.parquet"]


def _parts(folder: Path, n: int, rows: int = 5) -> None:
    folder.mkdir(parents=True)
    for i in range(n):
        t = pa.table({"rank": pa.array([0] * rows, pa.int32()),
                      "step": pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
                      "op": pa.array(["all_reduce", "broadcast"][i % 2:] * rows)[:rows].dictionary_encode()})
        pq.write_table(t, folder / f"part-{i:06d}.parquet")


def test_merge_keeps_every_row_once_and_one_row_group_per_part(tmp_path):
    folder = tmp_path / "steps" / "rank-00000"
    _parts(folder, 6)
    whole = pa.concat_tables([pq.read_table(f) for f in sorted(folder.iterdir())])
    out = merge_parts(folder, 0, 3)
    assert out is not None and out.name == "part-000000-000003.parquet"
    assert sorted(p.name for p in folder.iterdir()) == [
        "part-000000-000003.parquet", "part-000004.parquet", "part-000005.parquet"]
    meta = pq.ParquetFile(out).metadata
    assert meta.num_row_groups == 4 and meta.num_rows == 20
    live = live_parts(p.name for p in folder.iterdir())
    read = pa.concat_tables([pq.read_table(folder / n) for *_, n in live])
    assert read.column("step").to_pylist() == whole.column("step").to_pylist() == list(range(30))
    assert read.column("op").to_pylist() == whole.column("op").to_pylist()
    assert merge_parts(folder, 10, 13) is None  # nothing there: nothing changes


def test_parts_with_different_columns_are_left_as_they_are(tmp_path):
    folder = tmp_path / "rank-00000"
    _parts(folder, 2)
    pq.write_table(pa.table({"rank": pa.array([0], pa.int32()), "step": pa.array([10], pa.int64())}),
                   folder / "part-000002.parquet")
    assert merge_parts(folder, 0, 2) is None
    assert len(list(folder.iterdir())) == 3


@pytest.mark.parametrize("left", [[0], [1, 2, 3]])
def test_a_merge_cut_short_reads_each_row_once(tmp_path, left):
    """Killed between the merged file's rename and the removals: the parts still there are skipped."""
    from fabricpace.run.reader import part_files

    folder = tmp_path / "steps" / "rank-00000"
    _parts(folder, 5)
    keep = tmp_path / "copies"
    shutil.copytree(folder, keep)
    merge_parts(folder, 0, 3)
    for i in left:
        shutil.copy(keep / f"part-{i:06d}.parquet", folder)
    files = part_files(tmp_path / "steps", [])
    assert [f.name for f in files] == ["part-000000-000003.parquet", "part-000004.parquet"]
