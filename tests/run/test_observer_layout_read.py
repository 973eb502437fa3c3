"""Reading a run laid out as the observer writes it: a folder per rank, a part per ~50 steps.

Audit 17 A3: such a run cost 3-5 ms per part file in diagnose (1,024 ranks x 200 steps: 21-46 s
against 2.4-7 s for the same rows in ``TABLE/all/``): the coverage was computed three times (every
folder listed three times, every footer looked up four times) and the steps table was read one file
at a time. These tests pin that a diagnosis's reads (``load_run`` and two ``StepChunks``) list each
folder and open each part once, and that reading the parts together gives the rows the old per-file
reader gave: same rows, order, dtypes and warnings, across schema changes and unreadable parts.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic
from fabricpace.run import load_run
from fabricpace.run.reader import StepChunks


def _observer_layout(src: Path, dst: Path, part_steps: int = 50) -> Path:
    """``src`` (tables in ``TABLE/all/``) rewritten as the observer writes it."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("all"))
    for table in ("steps", "collectives"):
        t = pq.read_table(src / table / "all").sort_by([("rank", "ascending"), ("step", "ascending")])
        ranks, steps = t.column("rank").to_numpy(), t.column("step").to_numpy()
        starts = np.r_[0, np.flatnonzero(np.diff(ranks) != 0) + 1]
        ends = np.r_[starts[1:], len(ranks)]
        for a, b in zip(starts, ends, strict=True):
            folder = dst / table / f"rank-{int(ranks[a]):05d}"
            folder.mkdir(parents=True)
            cuts = np.r_[0, np.flatnonzero(np.diff(steps[a:b] // part_steps) != 0) + 1, b - a]
            for k in range(len(cuts) - 1):
                pq.write_table(t.slice(a + cuts[k], cuts[k + 1] - cuts[k]), folder / f"part-{k:06d}.parquet")
    return dst


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("layout")
    whole = write_synthetic(base / "all", SynthSpec(ranks=8, gpus_per_node=4, steps=200, buckets=2, seed=5))
    return whole, _observer_layout(whole, base / "obs")


def _sorted(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    return frame.sort(keys, maintain_order=True)


def test_same_rows_as_the_whole_table_layout(runs: tuple[Path, Path]) -> None:
    whole, obs = runs
    a, b = load_run(whole), load_run(obs)
    assert b.steps.height == 8 * 200
    assert b.steps.schema == a.steps.schema and b.collectives.schema == a.collectives.schema
    assert b.collectives.schema["group"] == pl.String  # dictionary columns as plain strings
    assert _sorted(b.steps, ["rank", "step"]).equals(_sorted(a.steps, ["rank", "step"]))
    keys = ["rank", "step", "seq"]
    assert _sorted(b.collectives, keys).equals(_sorted(a.collectives, keys))
    # rank by rank, part by part: the order of the files
    assert b.steps["rank"].is_sorted() and b.steps.filter(pl.col("rank") == 3)["step"].is_sorted()
    ranged = load_run(obs, tables=("steps",), step_range=(40, 60)).steps
    assert ranged.height == 8 * 21 and ranged["step"].min() == 40 and ranged["step"].max() == 60


def test_a_diagnosis_lists_each_folder_and_opens_each_part_once(
    runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = shutil.copytree(runs[1], tmp_path / "obs")
    time.sleep(1.2)  # listings and footers are kept only for what has not changed for a second
    folders = 2 + 2 * 8  # steps/, collectives/ and a folder per rank in each
    parts = sum(1 for _ in run.glob("*/rank-*/part-*.parquet"))
    listed: list[str] = []
    opened: list[str] = []
    real_scandir, real_listdir, real_pf, real_os_file = os.scandir, os.listdir, pq.ParquetFile, pa.OSFile

    def scandir(path):  # type: ignore[no-untyped-def]
        listed.append(str(path))
        return real_scandir(path)

    def listdir(path="."):  # type: ignore[no-untyped-def]
        listed.append(str(path))
        return real_listdir(path)

    class CountedFile(real_pf):  # type: ignore[misc,valid-type]
        def __init__(self, source, *args, **kwargs):  # type: ignore[no-untyped-def]
            if isinstance(source, str | os.PathLike):
                opened.append(str(source))
            super().__init__(source, *args, **kwargs)

    class CountedOSFile(real_os_file):  # type: ignore[misc,valid-type]
        def __init__(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
            opened.append(str(path))  # (opened by the extension type's __cinit__)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(pq, "ParquetFile", CountedFile)
    monkeypatch.setattr(pa, "OSFile", CountedOSFile)
    # what diagnose reads: every table but the collectives, then the collectives twice in chunks
    data = load_run(run, tables=["ranks", "steps", "ops", "pacing"])
    chunks = [StepChunks(run, "collectives", categorical=True) for _ in range(2)]
    assert data.steps.height == 8 * 200 and all(c.rows > 0 for c in chunks)
    part_folders = [p for p in listed if "/rank-" in p or p.endswith(("/steps", "/collectives"))]
    assert len(part_folders) <= folders, f"{len(part_folders)} listings of {folders} folders"
    part_opens = [p for p in opened if "/part-" in p]
    assert len(part_opens) == len(set(part_opens)) == parts, f"{len(part_opens)} opens of {parts} parts"
    # a caller that has the coverage passes it: nothing is listed again
    listed.clear()
    again = StepChunks(run, "collectives", coverage=data.coverage)
    assert again.rows == chunks[0].rows and not [p for p in listed if "/rank-" in p]


def test_schema_change_between_parts_and_an_unreadable_part(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Parts written by an older version (no ``samples``, ``paced_ns``; ``step`` as int32) among new
    ones are read together, the missing columns null; an unreadable part is a warning, its steps
    left out for every rank (coverage), the other parts still read."""
    run = shutil.copytree(runs[1], tmp_path / "obs")
    for rank in (2, 5):
        part = run / "steps" / f"rank-{rank:05d}" / "part-000001.parquet"
        t = pq.read_table(part).drop(["samples", "paced_ns"])
        t = t.set_column(t.column_names.index("step"), "step", t["step"].cast(pa.int32()))
        pq.write_table(t, part)
    (run / "steps" / "rank-00006" / "part-000003.parquet").write_bytes(b"PAR1 torn")
    whole = load_run(runs[0])
    data = load_run(run, all_steps=True)
    assert data.steps.schema == whole.steps.schema
    old = data.steps.filter(pl.col("rank").is_in([2, 5]) & pl.col("step").is_between(50, 99))
    assert old.height == 100 and old["samples"].null_count() == 100
    assert data.steps["samples"].null_count() == 100
    assert data.steps.height == 8 * 200 - 50  # rank 6's last part is lost
    assert any("rank-00006/part-000003.parquet: unreadable chunk skipped" in w for w in data.warnings)
    kept = load_run(run).steps  # steps 150..199 left out for every rank
    assert kept.height == 8 * 150 and kept["step"].max() == 149
