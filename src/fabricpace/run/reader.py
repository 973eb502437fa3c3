"""Load a run directory into polars frames, reporting what is missing or truncated instead of failing."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace._errors import RunDirError
from fabricpace.run.manifest import Manifest, read_manifest
from fabricpace.run.schema import TABLES


@dataclass(kw_only=True)
class RunData:
    """One loaded run. Frames are empty (with the contract columns) when a table is absent."""

    path: Path
    manifest: Manifest
    ranks: pl.DataFrame
    steps: pl.DataFrame
    collectives: pl.DataFrame
    ops: pl.DataFrame
    pacing: pl.DataFrame
    warnings: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return int(self.manifest.world_size)


def _empty(name: str) -> pl.DataFrame:
    schema, _ = TABLES[name]
    plain = pa.schema(
        [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema]
    )
    return pl.DataFrame(pl.from_arrow(plain.empty_table()))


def _read_parts(
    files: list[Path], name: str, warnings: list[str], step_range: tuple[int, int] | None = None
) -> pl.DataFrame:
    frames = []
    has_step = "step" in TABLES[name][0].names
    filters = (
        [("step", ">=", int(step_range[0])), ("step", "<=", int(step_range[1]))]
        if step_range is not None and has_step
        else None
    )
    for f in files:
        try:
            t = pq.read_table(f, filters=filters)
        except (OSError, pa.ArrowInvalid) as exc:
            warnings.append(f"{f}: unreadable chunk skipped ({exc})")
            continue
        # Dictionary columns become plain strings so frames from many chunks concatenate cleanly.
        cols = [c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in t.columns]
        frames.append(pl.DataFrame(pl.from_arrow(pa.Table.from_arrays(cols, names=t.column_names))))
    if not frames:
        return _empty(name)
    return pl.concat(frames, how="diagonal_relaxed")


def load_run(
    run_dir: str | os.PathLike[str],
    *,
    tables: Collection[str] | None = None,
    step_range: tuple[int, int] | None = None,
) -> RunData:
    """Load RUN_DIR. Raises RunDirError when it is not a run directory; truncation becomes warnings.

    ``tables``: read only these (the others come back empty). A study needs only ``steps``; the
    ``collectives`` table has one row per rank, collective and step (372 M rows for 64 nodes x 8 GPUs,
    913 buckets and 800 steps), which read eagerly does not fit in memory. ``step_range`` (first,
    last): only those steps' rows of the tables that have a step column."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunDirError(f"{path}: not a directory; pass a run directory written by fabricpace")
    manifest = read_manifest(path)
    warnings: list[str] = []
    if not manifest.complete:
        warnings.append(
            f"{path}: run did not close cleanly (manifest.complete is false); data may be truncated"
        )
    frames: dict[str, pl.DataFrame] = {}
    unknown = sorted(set(tables or ()) - set(TABLES))
    if unknown:
        raise ValueError(f"load_run: unknown table(s) {unknown}; tables are {sorted(TABLES)}")
    for name, (_, chunked) in TABLES.items():
        if tables is not None and name not in tables:
            frames[name] = _empty(name)
            continue
        if chunked:
            folder = path / name
            files = sorted(folder.glob("*/part-*.parquet")) if folder.is_dir() else []
        else:
            single = path / f"{name}.parquet"
            files = [single] if single.is_file() else []
        frames[name] = _read_parts(files, name, warnings, step_range)
    for name in ("ranks", "steps"):
        if (tables is None or name in tables) and frames[name].height == 0:
            warnings.append(f"{path}: no {name} rows")
    return RunData(path=path, manifest=manifest, warnings=warnings, **frames)
