"""Load a run directory into polars frames, reporting what is missing or truncated instead of failing.

``load_run`` reads whole tables (or some tables / a range of steps); ``StepChunks`` reads one chunked
table a few steps at a time, for tables too large to hold (the collectives of a large run), keeping
instances that span a chunk boundary whole.

Both compare ranks over the same steps: where ranks' rows cover different steps (a lost or unreadable
part, a rank that stopped early, a rank folder that is a file), the steps some rank lacks are left
out for every rank (``coverage.step_coverage``; ``all_steps=True`` reads them anyway) and
``load_run`` says which, in ``RunData.warnings``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace._errors import RunDirError
from fabricpace.run.coverage import Coverage, list_folder, read_footer, step_coverage
from fabricpace.run.manifest import Manifest, read_manifest
from fabricpace.run.parts import live_parts
from fabricpace.run.schema import PACING_PARTS_KEY, TABLES


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
    # Which steps every rank covers and which were left out for all (None: not computed).
    coverage: Coverage | None = None

    @property
    def world_size(self) -> int:
        return int(self.manifest.world_size)

    @property
    def common_steps(self) -> tuple[int, int] | None:
        """First and last step every rank covers (``coverage.excluded`` lists any gap between)."""
        return self.coverage.common if self.coverage is not None else None


def _empty(name: str) -> pl.DataFrame:
    schema, _ = TABLES[name]
    plain = pa.schema(
        [pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type) for f in schema]
    )
    return pl.DataFrame(pl.from_arrow(plain.empty_table()))


# Columns without which a table means nothing: a file that lacks one was written by another version
# or edited (the audit renamed steps.t_start_ns and dropped collectives.t_exit_ns: polars tracebacks
# deep inside diagnose, report and export). Other contract columns may be absent (read as null).
REQUIRED: dict[str, tuple[str, ...]] = {
    "ranks": ("rank",),
    "steps": ("rank", "step", "t_start_ns", "t_end_ns"),
    "collectives": ("rank", "step", "seq", "group", "t_enter_ns", "t_exit_ns"),
    "ops": ("rank", "step", "op"),
    "pacing": ("step", "policy", "action"),
}


def _kind(t: pa.DataType) -> str:
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return str(t)


# Schemas that passed check_schema, per table: a run's thousands of parts share one or two schemas,
# and checking each part's cost 0.26 ms (3 s of a 1,024-rank diagnosis, audit 17 A3).
_CHECKED: dict[str, list[pa.Schema]] = {}


def check_schema(file: Path, schema: pa.Schema, name: str) -> None:
    """Raise RunDirError (one line: the file, the column, the fix) when a file of table ``name`` lacks a
    required column or holds a contract column of the wrong kind (a step stored as text)."""
    known = _CHECKED.setdefault(name, [])
    if any(schema.equals(k) for k in known):
        return
    _check_schema(file, schema, name)
    if len(known) < 64:
        known.append(schema)


def _check_schema(file: Path, schema: pa.Schema, name: str) -> None:
    contract, _ = TABLES[name]
    fix = "(written by another fabricpace version, or edited?); re-create the run"
    for col in REQUIRED[name]:
        if col not in schema.names:
            raise RunDirError(f"{file}: column {col} missing {fix}")
    for f in contract:
        if f.name not in schema.names:
            continue
        want, got = _kind(f.type), _kind(schema.field(f.name).type)
        # integers where floats are expected are fine; null columns are fine anywhere
        if got != want and got != "null" and not (want == "float" and got == "integer"):
            got_type = schema.field(f.name).type
            raise RunDirError(f"{file}: column {f.name} is {got_type}, expected {want} {fix}")


def part_files(folder: Path, warnings: list[str]) -> list[Path]:
    """``folder/*/part-*.parquet``, sorted; a folder that cannot be listed becomes a warning (a plain
    glob returns nothing for it, and an unreadable collectives/ read as "no collectives recorded").
    Parts covered by a merged part of the same folder are left out (``run.parts.live_parts``)."""
    if not folder.is_dir():
        return []
    files: list[Path] = []
    try:
        subs = [folder / n for n, is_dir in list_folder(folder) if is_dir]
    except OSError as exc:
        warnings.append(f"{folder}: unreadable folder skipped ({exc.strerror or exc})")
        return []
    for sub in subs:
        try:
            names = [n for n, _ in list_folder(sub)]
            files += [sub / n for _, _, n in live_parts(names)]
        except OSError as exc:
            warnings.append(f"{sub}: unreadable folder skipped ({exc.strerror or exc})")
    return sorted(files)


_UNREADABLE = (OSError, pl.exceptions.PolarsError, pa.ArrowInvalid)


def _scan(files: list[Path], step_range: tuple[int, int] | None) -> pl.DataFrame:
    """Files of one schema read by one polars query (threaded; decoded straight into polars memory)."""
    lf = pl.scan_parquet([str(f) for f in files], glob=False, hive_partitioning=False)
    if step_range is not None:
        lf = lf.filter(pl.col("step").is_between(int(step_range[0]), int(step_range[1])))
    return lf.collect()


def _read_parts(
    files: list[Path], name: str, warnings: list[str], step_range: tuple[int, int] | None = None
) -> pl.DataFrame:
    """The rows of ``files`` (parts of table ``name``) in file order, as one frame.

    Consecutive files of one schema are read by one query: reading the 4,096 steps parts of an
    observer's 1,024 ranks one file at a time cost 15 s and, concatenating 4,096 small frames, half as
    much memory again as the rows themselves (audit 17 A3). A file whose footer cannot be read is a
    warning; a group that fails to read is read again file by file to name the bad one."""
    has_step = "step" in TABLES[name][0].names
    step_range = step_range if has_step else None
    groups: list[tuple[pa.Schema, list[Path]]] = []
    for f in files:
        try:
            schema = read_footer(f).schema
        except (OSError, pa.ArrowInvalid) as exc:
            warnings.append(f"{f}: unreadable chunk skipped ({exc})")
            continue
        check_schema(f, schema, name)
        if groups and groups[-1][0].equals(schema):
            groups[-1][1].append(f)
        else:
            groups.append((schema, [f]))
    frames: list[pl.DataFrame] = []
    for schema, batch in groups:
        # A range filter on a file without a step column: its rows are kept (the contract has one).
        rng = step_range if "step" in schema.names else None
        try:
            frames.append(_scan(batch, rng))
        except _UNREADABLE:
            for f in batch:
                try:
                    frames.append(_scan([f], rng))
                except _UNREADABLE as exc:
                    warnings.append(f"{f}: unreadable chunk skipped ({exc})")
    if not frames:
        return _empty(name)
    out = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
    # Dictionary columns come back as plain strings, whatever the part's encoding.
    return out.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))


def _read_pacing(path: Path, warnings: list[str], step_range: tuple[int, int] | None) -> pl.DataFrame:
    """pacing.parquet and, when the run did not close, the parts its decision log left in pacing/
    after the last one joined into pacing.parquet (``PACING_PARTS_KEY``): pacing.parquet alone holds
    only the decisions up to its last rewrite (at least half of them).

    The parts are listed before pacing.parquet is read, and its key is read after its rows: a join
    that the running job's writer makes in between then never counts a decision twice (at worst, parts
    joined meanwhile are missing from this read, without a warning)."""
    parts = part_files(path / "pacing", warnings)
    single = path / "pacing.parquet"
    frames, last = [], -1
    if single.is_file():
        frame = _read_parts([single], "pacing", warnings, step_range)
        frames.append(frame)
        try:
            last = int((pq.read_schema(single).metadata or {}).get(PACING_PARTS_KEY, b"-1"))
        except (OSError, pa.ArrowInvalid, ValueError):
            last = -1
    later = [f for f in parts if f.stem.split("-")[-1].isdigit() and int(f.stem.split("-")[-1]) > last]
    later = [f for f in later if f.is_file()]  # (joined and removed since they were listed)
    if later:
        warnings.append(f"{path}: pacing decisions also read from {len(later)} part(s) left in "
                        f"{path / 'pacing'} (the run did not close; they were not yet joined into "
                        "pacing.parquet)")
        frames.append(_read_parts(later, "pacing", warnings, step_range))
    if not frames:
        return _empty("pacing")
    return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]


def _rank_ids(path: Path, frame: pl.DataFrame | None) -> list[int]:
    """The ranks ranks.parquet lists (from the loaded frame, else its rank column)."""
    if frame is None:
        single = path / "ranks.parquet"
        if not single.is_file():
            return []
        try:
            frame = pl.from_arrow(pq.read_table(single, columns=["rank"]))  # type: ignore[assignment]
        except (OSError, pa.ArrowInvalid, KeyError, pl.exceptions.PolarsError):
            return []
    assert isinstance(frame, pl.DataFrame)
    if frame.height == 0 or "rank" not in frame.columns:
        return []
    return [int(r) for r in frame["rank"].drop_nulls().unique().to_list()]


def run_coverage(path: Path, manifest: Manifest | None = None, ranks: pl.DataFrame | None = None) -> Coverage:
    """``step_coverage`` of a run directory, with the ranks of its ranks.parquet and its manifest."""
    if manifest is None:
        try:
            manifest = read_manifest(path)
        except RunDirError:
            manifest = None
    extra = manifest.extra if manifest is not None and isinstance(manifest.extra, dict) else None
    return step_coverage(path, ranks=_rank_ids(path, ranks), extra=extra)


def common_steps(run_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """First and last step that every rank of ``run_dir`` covers in its steps and collectives
    (``run_coverage(...).excluded`` lists steps left out between them); None when none is left."""
    return run_coverage(Path(run_dir)).common


def load_run(
    run_dir: str | os.PathLike[str],
    *,
    tables: Collection[str] | None = None,
    step_range: tuple[int, int] | None = None,
    all_steps: bool = False,
) -> RunData:
    """Load RUN_DIR. Raises RunDirError when it is not a run directory; truncation becomes warnings.

    ``tables``: read only these (the others come back empty). A study needs only ``steps``; the
    ``collectives`` table has one row per rank, collective and step (372 M rows for 64 nodes x 8 GPUs,
    913 buckets and 800 steps), which read eagerly does not fit in memory. ``step_range`` (first,
    last): only those steps' rows of the tables that have a step column.

    Where ranks cover different steps (``coverage.step_coverage``: lost parts, a rank that stopped
    early, a rank without rows) the steps some rank lacks are left out of the steps, collectives and
    ops of every rank (a rank without collectives rows: the whole collectives table), and a warning
    says which; ``all_steps=True`` keeps them (the warnings stay)."""
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
            files = part_files(path / name, warnings)
        elif name == "pacing":
            frames[name] = _read_pacing(path, warnings, step_range)
            continue
        else:
            single = path / f"{name}.parquet"
            files = [single] if single.is_file() else []
        frames[name] = _read_parts(files, name, warnings, step_range)
    for name in ("ranks", "steps"):
        if (tables is None or name in tables) and frames[name].height == 0:
            warnings.append(f"{path}: no {name} rows")
    loaded_ranks = frames["ranks"] if tables is None or "ranks" in tables else None
    coverage = run_coverage(path, manifest, loaded_ranks)
    warnings += coverage.warnings
    if not all_steps and coverage.restricts:
        for name in ("steps", "collectives", "ops"):
            frames[name] = coverage.apply(frames[name], name)
    return RunData(path=path, manifest=manifest, warnings=warnings, coverage=coverage, **frames)


def _held(frame: pl.DataFrame, keys: list[str], after: int) -> pl.Series | None:
    """Rows of the instances (``keys``) that have a row with ``step > after``; None when none do.

    The instances with a late row are few (one step's worth); their rows are found with a cheap
    integer pre-filter on the last key, then matched exactly on all keys (several times faster than a
    window or a join over the whole chunk)."""
    tail = frame.filter(pl.col("step") > after).select(keys).unique()
    if tail.height == 0:
        return None
    last = keys[-1]
    cand = frame.select(pl.col(last).is_in(tail[last].unique().to_list()))[last]
    hit = (
        frame.with_row_index("_row")
        .filter(cand)
        .join(tail, on=keys, how="semi", nulls_equal=True)["_row"]
        .to_numpy()
    )
    mask = np.zeros(frame.height, dtype=bool)
    mask[hit] = True
    return pl.Series("held", mask)


# Rows per chunk when a table is streamed (the collectives in diagnose, report): bounds the collectives'
# share of memory only; what callers keep per rank and step (the steps table, matrices) grows with
# ranks x steps (audit 17 A3: ~320 B per rank-step in diagnose).
DEFAULT_CHUNK_ROWS = 4_000_000


@dataclass(frozen=True, kw_only=True)
class _Piece:
    """One Parquet row group of a chunked table and the steps it holds (from its statistics)."""

    file: Path
    row_group: int
    rows: int
    first: int
    last: int


class StepChunks:
    """A chunked table (``collectives``, ``steps``, ``ops``) read a few steps at a time.

    The Parquet footers are read once: every row group's step range comes from its statistics (or,
    without statistics, from its step column), so reading the steps ``lo..hi`` opens only the files
    that hold them, and polars' reader skips the other row groups. Rows without a step are never
    returned. Memory is bounded by the rows of one chunk, whatever the size of the run::

        table = StepChunks(run_dir)                  # collectives
        for lo, hi, frame in table.chunks(rows_per_chunk=5_000_000, whole=("group", "seq")):
            ...

    ``whole``: key columns of an *instance* whose rows may carry different steps on different ranks
    (a collective that one rank counts in step 7 and another in step 8): an instance with a row in the
    last ``carry_steps`` steps of a chunk is held back and handed out with the next chunk, so a chunk
    boundary does not split it (when one spans more steps than that, the caller sees the same key in
    two chunks and can retry with a larger ``carry_steps``).

    ``columns``: read only these; ``categorical``: string columns as polars categoricals (cheaper to
    read and group by) instead of plain strings as ``load_run`` gives them. As ``load_run``, it leaves
    out the steps some rank lacks (``coverage``) unless ``all_steps``; the warnings about them are
    ``load_run``'s (``coverage.warnings``), not in ``warnings``, which names unreadable parts only.
    ``coverage``: the run's, when the caller has it already (``RunData.coverage``); else it is read
    (folder listings and footers are cached per version of each, so a second read costs a ``stat`` per
    folder and part). ``step_range`` (first, last): only those steps (``load_run``'s ``step_range``);
    row groups outside it are never opened.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        table: str = "collectives",
        *,
        columns: Collection[str] | None = None,
        categorical: bool = False,
        all_steps: bool = False,
        coverage: Coverage | None = None,
        step_range: tuple[int, int] | None = None,
    ) -> None:
        if table not in TABLES or not TABLES[table][1] or "step" not in TABLES[table][0].names:
            raise ValueError(f"StepChunks: {table!r} is not a chunked table with a step column")
        self.path = Path(run_dir)
        self.table = table
        self.columns = list(columns) if columns is not None else None
        self.categorical = categorical
        self.warnings: list[str] = []
        self.pieces: list[_Piece] = []
        self._names: dict[Path, tuple[str, ...]] = {}
        files = part_files(self.path / table, self.warnings)
        for f in files:
            try:
                foot = read_footer(f)
                check_schema(f, foot.schema, table)
                self._names[f] = tuple(foot.schema.names)
                if not foot.has_step:
                    self.warnings.append(f"{f}: no step column; chunk skipped")
                    continue
                for rg, (n, lo, hi) in enumerate(foot.groups):
                    if step_range is not None and n and lo is not None and hi is not None:
                        if hi < step_range[0] or lo > step_range[1]:
                            continue  # a row group wholly outside the steps asked for is never read
                        lo, hi = max(lo, step_range[0]), min(hi, step_range[1])
                    if n and lo is not None and hi is not None:
                        self.pieces.append(_Piece(file=f, row_group=rg, rows=n, first=lo, last=hi))
            except (OSError, pa.ArrowInvalid) as exc:
                self.warnings.append(f"{f}: unreadable chunk skipped ({exc})")
        self.coverage = coverage if coverage is not None else run_coverage(self.path)
        self._keep = None if all_steps or not self.coverage.restricts else self.coverage
        if self._keep is not None and table in self.coverage.dropped:
            self.pieces = []  # a rank has no rows here: the table is left out (load_run says so)

    @property
    def rows(self) -> int:
        """Rows in the table (those of row groups without any step included)."""
        return sum(p.rows for p in self.pieces)

    @property
    def step_span(self) -> tuple[int, int] | None:
        """(first, last) step present, or None for an empty table."""
        if not self.pieces:
            return None
        return min(p.first for p in self.pieces), max(p.last for p in self.pieces)

    def step_ranges(self, rows_per_chunk: int) -> list[tuple[int, int]]:
        """Consecutive (lo, hi) step ranges of about ``rows_per_chunk`` rows each (rows assumed even
        over the step span), covering every step."""
        span = self.step_span
        if span is None:
            return []
        first, last = span
        n_steps = last - first + 1
        per_step = max(self.rows / n_steps, 1.0)
        width = max(1, int(rows_per_chunk // per_step))
        return [(lo, min(lo + width - 1, last)) for lo in range(first, last + 1, width)]

    def read(self, lo: int, hi: int) -> pl.DataFrame:
        """Rows with ``lo <= step <= hi``, in file order (the order ``load_run`` gives).

        Read by polars' own Parquet reader, which skips row groups by their step statistics and
        decodes straight into polars memory (a third of the peak of decoding through Arrow first)."""
        files = list(dict.fromkeys(p.file for p in self.pieces if p.first <= hi and p.last >= lo))
        in_range = pl.col("step").is_between(lo, hi)
        frames: list[pl.DataFrame] = []
        # Files with the same columns are scanned together (one query, not thousands of small ones).
        start = 0
        while start < len(files):
            end = start + 1
            while end < len(files) and self._names[files[end]] == self._names[files[start]]:
                end += 1
            batch = files[start:end]
            start = end
            try:
                frames.append(self._scan(batch, in_range))
            except _UNREADABLE:  # find the unreadable file(s) one by one
                for f in batch:
                    try:
                        frames.append(self._scan([f], in_range))
                    except _UNREADABLE as exc:
                        self.warnings.append(f"{f}: unreadable chunk skipped ({exc})")
        if self._keep is not None:
            frames = [self._keep.apply(f, self.table) for f in frames]
        frames = [f for f in frames if f.height]
        if not frames:
            empty = _empty(self.table)
            return empty.select(self.columns) if self.columns is not None else empty
        out = frames[0] if len(frames) == 1 else pl.concat(frames, how="diagonal_relaxed")
        if not self.categorical:  # plain strings, as load_run gives them
            out = out.with_columns(pl.col(pl.Categorical).cast(pl.String))
        return out

    def _scan(self, files: list[Path], in_range: pl.Expr) -> pl.DataFrame:
        names = self._names[files[0]]
        # Columns a file lacks are simply not read (the caller sees them missing or null).
        cols = [c for c in self.columns if c in names] if self.columns is not None else list(names)
        return pl.scan_parquet([str(f) for f in files], glob=False).filter(in_range).select(cols).collect()

    def chunks(
        self,
        rows_per_chunk: int,
        *,
        whole: Sequence[str] | None = None,
        carry_steps: int = 1,
    ) -> Iterator[tuple[int, int, pl.DataFrame]]:
        """(lo, hi, rows) per step range; with ``whole``, instances are kept in one piece (see class)."""
        ranges = self.step_ranges(rows_per_chunk)
        held: pl.DataFrame | None = None
        for i, (lo, hi) in enumerate(ranges):
            frame = self.read(lo, hi)
            if held is not None and held.height:
                frame = pl.concat([held, frame], how="diagonal_relaxed")
            held = None
            if whole and i + 1 < len(ranges) and frame.height:
                mask = _held(frame, list(whole), hi - carry_steps)
                if mask is not None:
                    held = frame.filter(mask)
                    frame = frame.filter(~mask)
            yield lo, hi, frame
