"""Crash-safe writers for the run directory.

Every file is written to a temporary name and renamed into place, so a process killed at any moment
(SIGKILL included) leaves only complete Parquet chunks behind. Chunked tables live in
``TABLE/rank-00003/part-000012.parquet``; each rank writes only its own folder, so no rank waits on
another to persist its telemetry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.run.manifest import Manifest, write_manifest
from fabricpace.run.schema import TABLES


def write_table_atomic(path: str | os.PathLike[str], table: pa.Table) -> Path:
    """Write one Parquet file via temp file + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return path


def to_table(name: str, columns: Mapping[str, Sequence[Any] | Any]) -> pa.Table:
    """Build a table of the named run-directory kind from columns (lists or numpy arrays).

    Contract columns are cast to their schema types; extra columns are kept as given.
    """
    schema, _ = TABLES[name]
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    n = None
    for f in schema:
        if f.name not in columns:
            raise KeyError(f"{name}: column {f.name!r} missing")
        values = columns[f.name]
        typ = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        arr = pa.array(values, type=typ)
        if pa.types.is_dictionary(f.type):
            arr = arr.dictionary_encode()
        arrays.append(arr)
        fields.append(pa.field(f.name, arr.type))
        n = len(arr) if n is None else n
    for key, values in columns.items():
        if key not in schema.names:
            arr = pa.array(values)
            arrays.append(arr)
            fields.append(pa.field(key, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


class ChunkWriter:
    """Buffers rows of one chunked table for one rank and flushes them as numbered Parquet parts."""

    def __init__(self, run_dir: str | os.PathLike[str], table: str, rank: int) -> None:
        if not TABLES[table][1]:
            raise ValueError(f"{table} is not a chunked table")
        self.table = table
        self.folder = Path(run_dir) / table / f"rank-{rank:05d}"
        self._part = 0
        self._rows: dict[str, list[Any]] = {c: [] for c in TABLES[table][0].names}

    def append(self, **row: Any) -> None:
        """Append one row; contract columns left out are null, extra columns are added on first use."""
        n = len(self)
        for key in row.keys() - self._rows.keys():
            self._rows[key] = [None] * n
        for key, values in self._rows.items():
            values.append(row.get(key))

    def extend(self, columns: Mapping[str, Sequence[Any]]) -> None:
        for key, values in columns.items():
            self._rows.setdefault(key, [])
            self._rows[key].extend(values)

    def __len__(self) -> int:
        return len(self._rows[TABLES[self.table][0].names[0]])

    def flush(self) -> Path | None:
        """Write buffered rows as the next part; returns its path (None when nothing was buffered)."""
        if len(self) == 0:
            return None
        table = to_table(self.table, self._rows)
        path = write_table_atomic(self.folder / f"part-{self._part:06d}.parquet", table)
        self._part += 1
        for values in self._rows.values():
            values.clear()
        return path


class RunWriter:
    """Writes a whole run directory from in-memory columns (simulator, importers, tests)."""

    def __init__(self, run_dir: str | os.PathLike[str], manifest: Manifest) -> None:
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(self.run_dir, manifest)

    def write(
        self, table: str, columns: Mapping[str, Sequence[Any] | Any], *, rank: int | None = None
    ) -> Path:
        """Write a whole table (or, for chunked tables, one rank's part when ``rank`` is given)."""
        _schema, chunked = TABLES[table]
        t = to_table(table, columns)
        if not chunked:
            return write_table_atomic(self.run_dir / f"{table}.parquet", t)
        folder = self.run_dir / table / ("all" if rank is None else f"rank-{rank:05d}")
        existing = len(list(folder.glob("part-*.parquet"))) if folder.exists() else 0
        return write_table_atomic(folder / f"part-{existing:06d}.parquet", t)

    def close(self, **extra: Any) -> None:
        """Mark the run complete (manifest.complete = True)."""
        self.manifest.complete = True
        self.manifest.extra.update(extra)
        write_manifest(self.run_dir, self.manifest)
