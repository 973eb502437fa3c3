"""Crash-safe writers for the run directory.

Every file is written to a temporary name and renamed into place, so a process killed at any moment
(SIGKILL included) leaves only complete Parquet chunks behind. Chunked tables live in
``TABLE/rank-00003/part-000012.parquet``; each rank writes only its own folder, so no rank waits on
another to persist its telemetry.

The run directory is created once, when a writer starts (``RunRoot``), and never again: a run
directory removed (or replaced) while a job writes it makes the next write fail with a
``RunDirError`` that says so, instead of silently re-creating it and writing the rest of the run
into it (the audit's run then read ``complete: true`` with its first 350 steps gone). Folders below
it (``steps/``, ``steps/rank-00003/``) are created as needed.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.run.manifest import Manifest, run_dir_gone, write_manifest
from fabricpace.run.schema import TABLES

_PART = re.compile(r"part-\d+(-\d+)?\.parquet")  # (a merged part names its range: run/parts.py)
_ROWS = re.compile(r"rank-\d+|all")


class RunRoot:
    """A run directory as it was when its writer started.

    ``start()`` creates it (with its parents) and remembers which directory it is (device and inode);
    ``folder(rel)`` then checks that the same directory is still there and creates the folders of
    ``rel`` below it, one level at a time, so that a removed run directory is never brought back (a
    plain ``mkdir(parents=True)`` would). A folder this root created once must still be there later
    (a new directory under the old name can have the old inode number). A directory removed,
    replaced by another or turned into a file raises ``RunDirError``. Two ``stat`` calls per part.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._id: tuple[int, int] | None = None
        self._made: set[Path] = set()

    @property
    def started(self) -> bool:
        return self._id is not None

    def start(self) -> None:
        """Create the run directory (a writer's start) and remember it; later calls only check it."""
        if self._id is None:
            self.path.mkdir(parents=True, exist_ok=True)
            st = os.stat(self.path)
            self._id = (st.st_dev, st.st_ino)
        else:
            self.check()

    def check(self) -> None:
        """RunDirError unless the directory ``start`` saw is still there."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise run_dir_gone(self.path, seen=self._id is not None) from None
        if not stat.S_ISDIR(st.st_mode) or (self._id is not None and (st.st_dev, st.st_ino) != self._id):
            raise run_dir_gone(self.path, replaced=True)

    def folder(self, rel: str | os.PathLike[str]) -> Path:
        """``path / rel``, created below the run directory (started on first use), never above it."""
        self.start()
        out = self.path / rel
        if out in self._made:
            if not out.is_dir():
                raise run_dir_gone(self.path, replaced=True)
            return out
        make_below(self.path, rel, seen=True)
        self._made.add(out)
        return out


def make_below(run_dir: Path, rel: str | os.PathLike[str], *, seen: bool = False) -> Path:
    """Create ``run_dir / rel`` one level at a time; ``run_dir`` itself must exist (RunDirError;
    ``seen``: the caller had it, see ``run_dir_gone``)."""
    out = run_dir
    for name in Path(rel).parts:
        out = out / name
        try:
            out.mkdir()
        except FileExistsError:
            pass
        except FileNotFoundError:  # the level above vanished: the run directory was removed
            raise run_dir_gone(run_dir, seen=seen) from None
    return out


def _run_dir_of(path: Path) -> Path:
    """The run directory a file of the run-directory layout belongs to: ``RUN/TABLE/rank-N/part-M``
    (or ``.../all/part-M``) -> RUN; any other file (``RUN/ranks.parquet``) -> its folder."""
    if _PART.fullmatch(path.name) and _ROWS.fullmatch(path.parent.name):
        return path.parents[2]
    return path.parent


def write_table_atomic(
    path: str | os.PathLike[str], table: pa.Table, *, root: RunRoot | None = None
) -> Path:
    """Write one Parquet file via temp file + rename.

    The run directory is never created here: with ``root`` it is the one that writer started (and
    must still be there); without, it must exist (``RUN/TABLE/rank-N/part-M.parquet``: RUN;
    otherwise the file's folder). Folders below it are created. RunDirError when it is gone."""
    path = Path(path)
    if root is not None:
        root.folder(path.parent.relative_to(root.path))
    else:
        run_dir = _run_dir_of(path)
        if not run_dir.is_dir():
            raise run_dir_gone(run_dir)
        if path.parent != run_dir:
            make_below(run_dir, path.parent.relative_to(run_dir))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except FileNotFoundError:  # its folder vanished between the check and the write
        run_dir = root.path if root is not None else _run_dir_of(path)
        if not run_dir.is_dir():
            raise run_dir_gone(run_dir, seen=root is not None) from None
        raise
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
        self.root = RunRoot(run_dir)  # created at the first flush, never re-created
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
        path = write_table_atomic(self.folder / f"part-{self._part:06d}.parquet", table, root=self.root)
        self._part += 1
        for values in self._rows.values():
            values.clear()
        return path


class RunWriter:
    """Writes a whole run directory from in-memory columns (simulator, importers, tests)."""

    def __init__(self, run_dir: str | os.PathLike[str], manifest: Manifest) -> None:
        self.run_dir = Path(run_dir)
        self.manifest = manifest
        self.root = RunRoot(self.run_dir)
        self.root.start()
        write_manifest(self.run_dir, manifest)

    def write(
        self, table: str, columns: Mapping[str, Sequence[Any] | Any], *, rank: int | None = None
    ) -> Path:
        """Write a whole table (or, for chunked tables, one rank's part when ``rank`` is given)."""
        _schema, chunked = TABLES[table]
        t = to_table(table, columns)
        if not chunked:
            return write_table_atomic(self.run_dir / f"{table}.parquet", t, root=self.root)
        folder = self.root.folder(Path(table) / ("all" if rank is None else f"rank-{rank:05d}"))
        existing = len(list(folder.glob("part-*.parquet")))
        return write_table_atomic(folder / f"part-{existing:06d}.parquet", t, root=self.root)

    def close(self, **extra: Any) -> None:
        """Mark the run complete (manifest.complete = True)."""
        self.manifest.complete = True
        self.manifest.extra.update(extra)
        self.root.check()
        write_manifest(self.run_dir, self.manifest)
