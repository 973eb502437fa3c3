"""Which steps every rank's rows cover, read from the Parquet footers of the chunked tables.

A run directory can lose rows without any file saying so: a part truncated or zero bytes long (a
crash, a full disk), a part deleted, a rank folder replaced by a file, a rank that stopped early
while the others went on, a run directory removed and re-created under a running job. Comparing
ranks over such a directory compares different steps (the audit: a zero-byte collectives part of
rank 0 turned a healthy ``sync_amplification`` into ``topology_contention``). ``step_coverage``
finds, per table (steps, collectives) and rank, the steps its readable parts cover and the steps of
its lost parts, and from them the steps to leave out for *every* rank, so that whatever reads the
run compares ranks over the same steps; and it says so in warnings, one line per finding.

Lost parts are found by their numbers (``part-000003`` between two readable ones that is missing
or unreadable); the observer writes parts of whole steps, so the lost steps are those between the
neighbouring parts. Ranks are compared by their first and last step: the steps table exactly, the
collectives within one step (a collective one rank counts in step 7 and another in step 8 is no
loss). Only folders per rank can be compared: a table written whole (``TABLE/all/``, the simulator)
is taken as complete.

An import can also hold fewer ranks than the job had: when ``manifest.extra.job_world_size`` (what
the traces say, e.g. Kineto's ``distributedInfo.world_size``) is larger than the ranks present, the
first warning names the missing ones (a missing trace is often the culprit's).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.run.parts import live_parts

_V = TypeVar("_V")
INF = 1 << 62  # an open end of a step interval
_RANK = re.compile(r"rank-(\d+)")
# Tables compared rank by rank, with the step difference between ranks that is no loss.
COMPARED = {"steps": 0, "collectives": 1}


# ----------------------------------------------------------------------------------------- footers
@dataclass(frozen=True, kw_only=True)
class Footer:
    """What a part's footer says: its schema and, per row group, (rows, first step, last step)."""

    schema: pa.Schema
    has_step: bool
    groups: tuple[tuple[int, int | None, int | None], ...]
    ranks: tuple[int, int] | None = None  # (min, max) rank from the statistics, when they say

    @property
    def rows(self) -> int:
        return sum(n for n, _, _ in self.groups)

    @property
    def bounds(self) -> tuple[int, int] | None:
        firsts = [lo for _, lo, _ in self.groups if lo is not None]
        lasts = [hi for _, _, hi in self.groups if hi is not None]
        return (min(firsts), max(lasts)) if firsts else None


_FOOTERS: dict[str, tuple[tuple[int, int, int], Footer]] = {}
_FOOTERS_MAX = 200_000


def _step_bounds(pf: pq.ParquetFile, rg: int, col: int) -> tuple[int, int] | None:
    """(min, max) step of a row group: its statistics, else its step column read (8 bytes a row)."""
    stats = pf.metadata.row_group(rg).column(col).statistics
    if stats is not None and stats.has_min_max and stats.null_count == 0:
        return int(stats.min), int(stats.max)
    steps = pf.read_row_group(rg, columns=["step"]).column("step").drop_null()
    if len(steps) == 0:
        return None
    import pyarrow.compute as pc

    mm = pc.min_max(steps)
    return int(mm["min"].as_py()), int(mm["max"].as_py())


def read_footer(file: Path) -> Footer:
    """The footer of one part, read once per version of the file (``load_run`` and ``StepChunks``
    both need every part's step range; a large run has thousands of parts). Raises OSError or
    ``pa.ArrowInvalid`` for an unreadable part."""
    st = os.stat(file)
    sig = (st.st_ino, st.st_size, st.st_mtime_ns)
    key = str(file)
    hit = _FOOTERS.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    pf = pq.ParquetFile(file)
    md = pf.metadata
    paths = [md.schema.column(i).path for i in range(md.num_columns)]
    col = paths.index("step") if "step" in paths else -1
    rcol = paths.index("rank") if "rank" in paths else -1
    groups = []
    lo_r: list[int] = []
    hi_r: list[int] = []
    rank_stats = rcol >= 0
    for rg in range(md.num_row_groups):
        n = md.row_group(rg).num_rows
        bounds = _step_bounds(pf, rg, col) if n and col >= 0 else None
        groups.append((n, *(bounds or (None, None))))
        stats = md.row_group(rg).column(rcol).statistics if rank_stats and n else None
        if stats is not None and stats.has_min_max:
            lo_r.append(int(stats.min))
            hi_r.append(int(stats.max))
        elif n:
            rank_stats = False
    ranks = (min(lo_r), max(hi_r)) if rank_stats and lo_r else None
    foot = Footer(schema=pf.schema_arrow, has_step=col >= 0, groups=tuple(groups), ranks=ranks)
    # Kept only for a file unchanged for a second: file times advance in coarse ticks, so a file
    # rewritten in place within one tick (same inode and size) could otherwise read as the old one.
    if time.time_ns() - st.st_mtime_ns > 1_000_000_000:
        if len(_FOOTERS) >= _FOOTERS_MAX:
            _FOOTERS.clear()
        _FOOTERS[key] = (sig, foot)
    return foot


# ---------------------------------------------------------------------------------------- listings
_LISTINGS: dict[str, tuple[tuple[int, int, int], tuple[tuple[str, bool], ...]]] = {}


def list_folder(folder: Path) -> tuple[tuple[str, bool], ...]:
    """(name, is a folder) of each entry of ``folder``, listed once per version of the folder.

    An observer's run has a folder per rank and table: a diagnosis reads the coverage three times
    (``load_run`` and each ``StepChunks``) and the parts once, and listing 2,048 folders each time cost
    ~1 s of the 21-46 s of 1,024 ranks x 200 steps (audit 17 A3). A folder's mtime changes whenever an
    entry is added, removed or renamed in it (the writer renames every part into place), so one
    ``stat`` tells whether a listing still holds. Raises OSError for a folder that cannot be listed."""
    st = os.stat(folder)
    # ctime too: a folder made unreadable (chmod) keeps its mtime
    sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    key = str(folder)
    hit = _LISTINGS.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    with os.scandir(folder) as it:
        listing = tuple(sorted((e.name, e.is_dir()) for e in it))
    # As read_footer: kept only for a folder unchanged for a second (coarse mtime ticks).
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > 1_000_000_000:
        if len(_LISTINGS) >= _FOOTERS_MAX:
            _LISTINGS.clear()
        _LISTINGS[key] = (sig, listing)
    return listing


# ---------------------------------------------------------------------------------------- coverage
@dataclass(frozen=True, kw_only=True)
class RankSpan:
    """One rank's rows in one table: the steps of its readable parts and those of its lost parts."""

    table: str
    rank: int
    rows: int = 0
    first: int | None = None
    last: int | None = None
    lost: tuple[tuple[int, int], ...] = ()  # inclusive step intervals (open ends: -INF / INF)
    lost_parts: tuple[str, ...] = ()  # part names, for the warning
    why_empty: str = ""  # why a rank listed somewhere has no rows: "not a folder", ...
    foreign: bool = False  # its folder holds rows of other ranks: not one folder per rank


@dataclass(kw_only=True)
class Coverage:
    """Per table and rank (``spans``), the steps left out for every rank (``excluded``: sorted,
    disjoint, inclusive intervals; open ends are ±INF), the tables left out whole (``dropped``: a
    rank has no collectives rows) and what was found, in words (``warnings``)."""

    spans: dict[str, dict[int, RankSpan]] = field(default_factory=dict)
    excluded: list[tuple[int, int]] = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)  # tables left out whole: a rank has no rows there
    warnings: list[str] = field(default_factory=list)

    @property
    def span(self) -> tuple[int, int] | None:
        """(first, last) step of any rank's rows in the compared tables; None when there are none."""
        firsts = [s.first for t in self.spans.values() for s in t.values() if s.first is not None]
        lasts = [s.last for t in self.spans.values() for s in t.values() if s.last is not None]
        return (min(firsts), max(lasts)) if firsts else None

    @property
    def common(self) -> tuple[int, int] | None:
        """The first and last step that every rank covers (``excluded`` lists any steps left out
        between them); the whole span when nothing is left out; None when no step is left."""
        span = self.span
        if span is None:
            return None
        lo, hi = span
        for a, b in self.excluded:
            if a <= lo <= b:
                lo = b + 1
        for a, b in reversed(self.excluded):
            if a <= hi <= b:
                hi = a - 1
        return (lo, hi) if lo <= hi else None

    def keep(self, steps: np.ndarray) -> np.ndarray:
        """Boolean mask: the steps that are not left out."""
        steps = np.asarray(steps, dtype=np.int64)
        if not self.excluded:
            return np.ones(steps.shape, dtype=bool)
        starts = np.array([a for a, _ in self.excluded], dtype=np.int64)
        ends = np.array([b for _, b in self.excluded], dtype=np.int64)
        i = np.searchsorted(starts, steps, side="right") - 1
        inside = (i >= 0) & (steps <= ends[np.maximum(i, 0)])
        return ~inside

    @property
    def restricts(self) -> bool:
        """Whether any row is left out."""
        return bool(self.excluded or self.dropped)

    def apply(self, frame: pl.DataFrame, table: str | None = None) -> pl.DataFrame:
        """``frame`` (of ``table``) without the rows of left-out steps (rows without a step are kept)
        and empty when the table is left out whole."""
        if table in self.dropped:
            return frame.clear()
        if not self.excluded or frame.height == 0 or "step" not in frame.columns:
            return frame
        step = frame["step"]
        mask = self.keep(step.fill_null(0).to_numpy().astype(np.int64)) | step.is_null().to_numpy()
        return frame.filter(pl.Series(mask))


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _rank_span(table: str, rank: int, folder: Path) -> RankSpan:
    try:
        # (first, last part number, file): a merged part covers a range of numbers (run/parts.py)
        numbered = [(a, b, folder / n) for a, b, n in live_parts(n for n, _ in list_folder(folder))]
    except OSError as exc:
        why = f"{folder} cannot be listed ({exc.strerror or exc})"
        return RankSpan(table=table, rank=rank, why_empty=why)
    readable: list[tuple[int, int, int, int]] = []  # (first and last part number, first step, last step)
    bad: list[tuple[int, int]] = []
    rows = 0
    foreign = False
    for num, upto, f in numbered:
        try:
            foot = read_footer(f)
        except (OSError, pa.ArrowInvalid):
            bad.append((num, upto))
            continue
        rows += foot.rows
        foreign = foreign or (foot.ranks is not None and foot.ranks != (rank, rank))
        bounds = foot.bounds
        if bounds is not None:
            readable.append((num, upto, bounds[0], bounds[1]))
    seen = {n for a, b, _ in numbered for n in range(a, b + 1)}
    missing = [(n, n) for n in range(max(seen) + 1) if n not in seen] if seen else []
    lost: list[tuple[int, int]] = []
    for n, upto in sorted(bad + missing):
        before = [hi for _, m, _, hi in readable if m < n]
        after = [lo for m, _, lo, _ in readable if m > upto]
        a = max(before) + 1 if before else -INF
        b = min(after) - 1 if after else INF
        if a <= b:
            lost.append((a, b))
    names = tuple(
        f"part-{n:06d}" if n == upto else f"part-{n:06d}-{upto:06d}" for n, upto in sorted(bad + missing)
    )
    if not readable:
        why = "its only part is unreadable" if len(numbered) == 1 and bad else (
            "its parts are unreadable" if bad else "its folder holds no parts")
        return RankSpan(table=table, rank=rank, rows=rows, lost_parts=names, why_empty=why, foreign=foreign)
    return RankSpan(
        table=table,
        rank=rank,
        foreign=foreign,
        rows=rows,
        first=min(lo for _, _, lo, _ in readable),
        last=max(hi for _, _, _, hi in readable),
        lost=tuple(_merge(lost)),
        lost_parts=names,
    )


def table_spans(run_dir: Path, table: str) -> dict[int, RankSpan] | None:
    """Per rank folder of ``table``: its span (a ``rank-N`` entry that is no folder included, with
    no rows). None when the table is written whole (``TABLE/all/``), a rank folder holds rows of
    another rank (by its parts' statistics), or the table cannot be listed."""
    folder = run_dir / table
    if not folder.is_dir():
        return {}
    try:
        entries = list_folder(folder)
    except OSError:
        return None  # part_files says so
    if any(name == "all" for name, _ in entries):
        return None
    spans: dict[int, RankSpan] = {}
    for name, is_dir in entries:
        m = _RANK.fullmatch(name)
        if not m:
            continue
        rank = int(m.group(1))
        if is_dir:
            spans[rank] = _rank_span(table, rank, folder / name)
        else:
            spans[rank] = RankSpan(table=table, rank=rank, why_empty=f"{table}/{name} is not a folder")
    if any(s.foreign for s in spans.values()):
        return None  # a writer's own layout (one folder holding several ranks): not comparable here
    return spans


# -------------------------------------------------------------------------------------------- words
def ranks_text(ranks: Collection[int], limit: int = 8) -> str:
    """'rank 3', 'ranks 1, 3', 'ranks 0-255, 300' (runs of consecutive ranks joined, at most
    ``limit`` items, then how many ranks in all)."""
    rs = sorted(set(ranks))
    runs: list[tuple[int, int]] = []
    for r in rs:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    items = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    text = ", ".join(items[:limit]) + (f", ... ({len(rs)} ranks)" if len(items) > limit else "")
    return f"{'rank' if len(rs) == 1 else 'ranks'} {text}"


def steps_text(intervals: Iterable[tuple[int, int]], span: tuple[int, int] | None) -> str:
    """'steps 50..99, 1400..1558' with open ends cut to ``span``."""
    parts = []
    for a, b in intervals:
        if span is not None:
            a, b = max(a, span[0]), min(b, span[1])
        if a > b:
            continue
        parts.append(f"{a}" if a == b else f"{a}..{b}")
    if not parts:
        return "no recorded step"
    one = len(parts) == 1 and ".." not in parts[0]
    return f"{'step' if one else 'steps'} {', '.join(parts)}"


def _by_value(values: dict[int, _V]) -> dict[_V, list[int]]:
    groups: dict[_V, list[int]] = {}
    for r, v in sorted(values.items()):
        groups.setdefault(v, []).append(r)
    return groups


# ------------------------------------------------------------------------------------------ compute
def step_coverage(
    run_dir: str | os.PathLike[str],
    *,
    ranks: Collection[int] | None = None,
    extra: dict[str, object] | None = None,
) -> Coverage:
    """The steps every rank covers in the steps and collectives tables of ``run_dir``.

    ``ranks``: the ranks the run should have (ranks.parquet's; a rank listed there without rows in a
    table is named in a warning). ``extra``: the manifest's ``extra`` (its ``steps``, the steps rank 0
    ran, and ``failed_steps``: a rank with fewer step rows is named)."""
    path = Path(run_dir)
    cov = Coverage()
    excluded: list[tuple[int, int]] = []
    missing: list[str] = []  # ranks without rows, fewer rows than the manifest says
    notes: list[str] = []  # lost parts, ranks starting late or ending early
    for table, slack in COMPARED.items():
        spans = table_spans(path, table)
        if not spans:
            continue
        cov.spans[table] = spans
        rows = {r: s for r, s in spans.items() if s.rows > 0 and s.first is not None}
        if not rows:
            continue  # nothing recorded in this table at all: the readers say so
        absent = sorted((set(ranks or ()) | set(spans)) - set(rows))
        if absent:
            whys = [spans[r].why_empty if r in spans else f"no {table}/rank-{r:05d} folder" for r in absent]
            why = f" ({whys[0]}{f'; {len(whys) - 1} more alike' if len(whys) > 1 else ''})"
            if table == "steps":
                # Step times are synchronized, so the other ranks' steps still describe the job; leaving
                # them all out emptied a one-rank record made under WORLD_SIZE>1 without a process group.
                role = ("step figures describe the other ranks only (a rank without rows may be the "
                        "slow one)")
            else:  # arrivals without these ranks could name the wrong rank, or none
                cov.dropped.add(table)
                role = ("their arrivals are unknown, so the collectives of every rank are left out: "
                        "findings that compare arrivals abstain (load_run(..., all_steps=True) reads them)")
            missing.append(
                f"no {table} rows of {ranks_text(absent)}{why}, which "
                f"{'ranks.parquet lists' if ranks and set(absent) & set(ranks) else 'the run has'}: "
                f"{role}"
            )
        lost = {r: (sp.lost_parts, sp.lost) for r, sp in rows.items() if sp.lost_parts}
        for (names, intervals), rs in _by_value(lost).items():
            excluded += intervals
            notes.append(f"{table} of {ranks_text(rs)}: {_parts_text(names)} missing or unreadable"
                         f"{f': {_lost_text(intervals)} lost' if intervals else ''}")
        if len(rows) >= 2:
            firsts = {r: s.first for r, s in rows.items() if s.first is not None}
            lasts = {r: s.last for r, s in rows.items() if s.last is not None}
            lo, hi = max(firsts.values()), min(lasts.values())
            if lo - min(firsts.values()) > slack:
                excluded.append((-INF, lo - 1))
                late = [r for r, f in firsts.items() if f - min(firsts.values()) > slack]
                if not all(rows[r].lost and rows[r].lost[0][0] <= -INF for r in late):  # else said
                    notes.append(
                        f"{table} of {ranks_text(late)} start at step "
                        f"{'/'.join(str(v) for v in sorted({firsts[r] for r in late}))}, the other ranks' "
                        f"at {min(firsts.values())}"
                    )
            if max(lasts.values()) - hi > slack:
                excluded.append((hi + 1, INF))
                early = [r for r, x in lasts.items() if max(lasts.values()) - x > slack]
                if not all(rows[r].lost and rows[r].lost[-1][1] >= INF for r in early):  # else said
                    notes.append(
                        f"{table} of {ranks_text(early)} end at step "
                        f"{'/'.join(str(v) for v in sorted({lasts[r] for r in early}))}, the other ranks' "
                        f"at {max(lasts.values())}"
                    )
        if table == "steps" and extra:
            missing += _short_of_manifest(rows, extra)
    cov.excluded = _merge(excluded)
    whole = cov.span
    inside = [(max(a, whole[0]), min(b, whole[1])) for a, b in cov.excluded] if whole else []
    inside = [(a, b) for a, b in inside if a <= b]
    if inside:  # first: what every number read from this run describes
        common = cov.common
        holes = [(a, b) for a, b in inside if common and common[0] < a and b < common[1]]
        use = (
            f"diagnosis and report use only the steps every rank covers, steps {common[0]}..{common[1]}"
            f"{f' except {steps_text(holes, None)}' if holes else ''}"
            if common
            else "no step is covered by every rank, so diagnosis and report have none to use"
        )
        cov.warnings.append(
            f"{path}: ranks cover different steps: {use}; {steps_text(inside, None)} left out for every rank"
        )
    cov.warnings += [f"{path}: {n}" for n in missing + notes]
    present = set(ranks or ()) | {r for t in cov.spans.values() for r, sp in t.items() if sp.rows > 0}
    absent_job = job_ranks_missing(present, (extra or {}).get("job_world_size"))
    if absent_job:  # first: every finding is about the ranks present only
        cov.warnings.insert(0, f"{path}: {job_ranks_text(absent_job, (extra or {})['job_world_size'])}")
    return cov


def job_ranks_missing(present: Collection[int], job_world_size: object) -> list[int]:
    """The ranks of a job of ``job_world_size`` ranks (an importer's ``manifest.extra.job_world_size``:
    what the traces say the job had) that ``present`` lacks; [] when unknown or none."""
    if not isinstance(job_world_size, int) or isinstance(job_world_size, bool) or job_world_size <= 0:
        return []
    if len(set(present)) >= job_world_size:
        return []
    return sorted(set(range(job_world_size)) - set(present))


def job_ranks_text(missing: Collection[int], job_world_size: object) -> str:
    """'ranks 2, 5 of 8 have no trace in this import; a culprit may be among them ...'."""
    one = len(missing) == 1
    return (
        f"{ranks_text(missing)} of {job_world_size} {'has' if one else 'have'} no trace in this import; "
        f"{'it may be the culprit' if one else 'a culprit may be among them'} (findings compare only the "
        f"ranks present); import {'its' if one else 'their'} trace{'' if one else 's'} too to judge the job"
    )


def _parts_text(names: tuple[str, ...]) -> str:
    """'part-000001', 'part-000000..part-000003' (consecutive), else the first three and a count."""
    nums = [int(n.split("-")[1]) for n in names]
    if len(nums) > 2 and nums == list(range(nums[0], nums[0] + len(nums))):
        return f"{names[0]}..{names[-1]}"
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _lost_text(intervals: Iterable[tuple[int, int]]) -> str:
    """'steps 50..99', 'rows before step 350', 'rows after step 1399'."""
    out = []
    for a, b in intervals:
        if a <= -INF and b >= INF:
            out.append("every row")
        elif a <= -INF:
            out.append(f"rows before step {b + 1}")
        elif b >= INF:
            out.append(f"rows after step {a - 1}")
        else:
            out.append(f"step {a}" if a == b else f"steps {a}..{b}")
    return ", ".join(out)


def _short_of_manifest(rows: dict[int, RankSpan], extra: dict[str, object]) -> list[str]:
    """Ranks with fewer step rows than the manifest says were run (``extra.steps`` less the
    ``failed_steps``, which are not rows)."""
    ran = extra.get("steps")
    if not isinstance(ran, int) or isinstance(ran, bool) or ran <= 0:
        return []
    failed = extra.get("failed_steps")
    want = ran - (len(failed) if isinstance(failed, list) else 0)
    short = {r: (s.rows, s.first, s.last) for r, s in rows.items() if s.rows < want}
    out = []
    for (n, first, last), rs in _by_value(short).items():
        missing: list[str] = []
        if first is not None and first > 0:
            missing.append(f"before step {first}")
        if last is not None and last < ran - 1:
            missing.append(f"after step {last}")
        if n < (last - first + 1 if first is not None and last is not None else 0):
            missing.append("between")
        where = f" ({', '.join(missing)})" if missing else ""
        less = f" ({ran - want} failed, not rows)" if want != ran else ""
        out.append(
            f"{ranks_text(rs)} {'has' if len(rs) == 1 else 'have'} {n} step rows ({first}..{last}) but "
            f"manifest.extra.steps says {ran} steps ran{less}: {want - n} missing{where} — lost, or "
            f"{'the rank' if len(rs) == 1 else 'these ranks'} stopped recording early"
        )
    return out
