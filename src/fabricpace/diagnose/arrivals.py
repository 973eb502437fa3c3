"""Arrival, wait and transfer per collective instance, streamed over the collectives table.

The collectives table has one row per rank, collective and step: ~200 DDP buckets per step make it the
largest thing a run holds (512 ranks × 300 steps is 31 M rows; 2,048 ranks × 1,000 steps 400 M). It is
read a few million rows at a time (``StepChunks``; instances are never split across chunks), and every
chunk is reduced at once to

* its per-instance aggregates (one row per ``(group, seq)``: kept, the instance table is small);
* the per-row lateness and wait, folded straight into dense [rank, step] matrices (lateness: max;
  wait: the union of a rank-step's wait intervals, so overlapping collectives count once);
* the (group, rank) pairs seen (group membership, for ``topology_contention``).

No per-row frame of the whole run is ever built, so memory is bounded by one chunk plus the matrices.
What depends on the previous instance of a group (a bucket's transfer starts after the one before it)
is computed on the whole instance table at the end, exactly as before streaming.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from fabricpace.run.reader import StepChunks

# Point-to-point transfers (pipeline sends/receives) wait on the pipeline schedule, not on a slow peer:
# they are kept for transfer/contention but left out of arrival skew.
_P2P = r"(?i)(send|recv|p2p|pp[-_ ]?comm|isend|irecv)"
KEYS = ["group", "seq"]


def index_of(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Position of each value in the sorted unique ``ids`` (-1 when absent), via a lookup table: O(n)."""
    out = np.full(values.size, -1, dtype=np.int64)
    if ids.size == 0 or values.size == 0:
        return out
    lo, hi = int(ids[0]), int(ids[-1])
    if hi - lo > 50_000_000:  # sparse ids: fall back to binary search
        pos = np.clip(np.searchsorted(ids, values), 0, ids.size - 1)
        return np.where(ids[pos] == values, pos, -1)
    lut = np.full(hi - lo + 1, -1, dtype=np.int64)
    lut[ids - lo] = np.arange(ids.size)
    inside = (values >= lo) & (values <= hi)
    out[inside] = lut[values[inside] - lo]
    return out


class _Grid:
    """[rank, step] accumulators: lateness (max) and wait (sum) of the same rows. The step axis is
    fixed; a rank first seen in a chunk adds a row (rare: ranks normally all appear in the steps)."""

    def __init__(self, ranks: np.ndarray, steps: np.ndarray) -> None:
        self.ranks = ranks
        self.steps = steps
        self.late = np.full((ranks.size, steps.size), -np.inf)
        self.wait = np.zeros((ranks.size, steps.size))
        # First start and last end of a cell's waits: a cell whose rows came in two chunks (an instance
        # held over) adds two unions, which can overlap; the span caps them.
        self.first = np.full((ranks.size, steps.size), np.inf)
        self.last = np.full((ranks.size, steps.size), -np.inf)

    def add_ranks(self, ranks: np.ndarray) -> None:
        new = np.setdiff1d(ranks, self.ranks)
        if new.size == 0:
            return
        merged = np.union1d(self.ranks, new)
        old_pos = np.searchsorted(merged, self.ranks)
        shape = (merged.size, self.steps.size)
        late, wait = np.full(shape, -np.inf), np.zeros(shape)
        first, last = np.full(shape, np.inf), np.full(shape, -np.inf)
        late[old_pos], wait[old_pos] = self.late, self.wait
        first[old_pos], last[old_pos] = self.first, self.last
        self.ranks, self.late, self.wait, self.first, self.last = merged, late, wait, first, last

    def fold(
        self,
        rank: np.ndarray,
        step: np.ndarray,
        late: np.ndarray,
        wait: np.ndarray,
        first: np.ndarray,
        last: np.ndarray,
    ) -> None:
        ri = index_of(rank, self.ranks)
        si = index_of(step, self.steps)
        ok = (ri >= 0) & (si >= 0)
        flat = ri[ok] * self.steps.size + si[ok]
        # Unbuffered in place: far cheaper than a group-by over millions of (rank, step) cells. Sums of
        # integer nanoseconds are exact in float64, so the order of the rows does not matter.
        np.maximum.at(self.late.reshape(-1), flat, late[ok])
        np.add.at(self.wait.reshape(-1), flat, wait[ok])
        np.minimum.at(self.first.reshape(-1), flat, first[ok])
        np.maximum.at(self.last.reshape(-1), flat, last[ok])

    def capped_wait(self) -> np.ndarray:
        span = np.where(np.isfinite(self.first), self.last - self.first, 0.0)
        return np.minimum(self.wait, np.maximum(span, 0.0))


@dataclass(kw_only=True)
class Arrivals:
    """What the detectors need from the collectives table."""

    ranks: np.ndarray  # every rank seen in the collectives, sorted
    rows: int  # usable rows (step, t_enter_ns and t_exit_ns known)
    instances: pl.DataFrame | None  # one row per instance (None without usable rows)
    late: np.ndarray | None  # [ranks, steps] lateness, max per cell (NaN where no arrival row)
    wait: np.ndarray | None  # [ranks, steps] wait, union of a cell's waits (NaN where no arrival row)
    members: pl.DataFrame  # (group, rank) pairs seen
    chunks: int  # chunks read (1 for an in-memory table)


def _chunk(c: pl.DataFrame, aligned: bool, waits: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-instance aggregates, per-row rank/step/late/wait of arrival instances) of whole instances."""
    c = c.with_columns(pl.col("group").fill_null("world"))
    if not aligned:
        c = c.with_columns(
            (pl.col("t_exit_ns") - pl.col("t_enter_ns")).clip(lower_bound=0).alias("inside_ns")
        )
    common = [
        pl.col("step").min().alias("step"),
        pl.col("op").first().alias("op"),
        pl.col("bytes").max().alias("bytes"),
        pl.len().alias("n"),
        pl.col("t_exit_ns").min().alias("min_exit"),
        # > 0 when every row saw a completion; DDP grad_hooks "arrival markers" have t_exit = t_enter.
        (pl.col("t_exit_ns") - pl.col("t_enter_ns")).min().alias("min_stay"),
    ]
    if aligned:
        per_basis = [
            pl.col("t_enter_ns").max().alias("last_enter"),
            pl.col("t_enter_ns").median().alias("median_enter"),
            pl.col("t_enter_ns").top_k(2).min().alias("second_enter"),
            pl.col("rank").get(pl.col("t_enter_ns").arg_max()).alias("last_rank"),
        ]
        back = ["last_enter", "median_enter"]
        back2 = pl.col("second_enter")  # of two: the earlier arrival
    else:
        per_basis = [
            pl.col("inside_ns").min().alias("min_inside"),
            pl.col("inside_ns").median().alias("median_inside"),
            pl.col("inside_ns").bottom_k(2).max().alias("second_inside"),
            pl.col("rank").get(pl.col("inside_ns").arg_min()).alias("last_rank"),
        ]
        back = ["min_inside", "median_inside"]
        back2 = pl.col("second_inside")  # of two: the longer stay, i.e. the earlier arrival
    inst = c.group_by(KEYS).agg(*common, *per_basis)
    # Two members: the median is the midpoint, half the gap — a rank that made its one peer wait 5 ms
    # read as 2.5 ms late, and when its peer was not early in the step's other collectives nothing
    # restored the other half (an audit's 2-rank DP subgroups in a 4-rank job: "late by 2.47 ms"
    # for a 5 ms sleep). The reference of a pair is its earlier arrival: the later rank is late by the
    # whole gap, the earlier one by 0. (Where a rank is late in every collective of the step, as a
    # slow rank under DDP, the lateness relative to its peer comes out the same as with the midpoint.)
    pair = pl.col("n") == 2
    inst = inst.with_columns(
        pl.when(pair).then(back2).otherwise(pl.col(back[1])).alias(back[1])
    )
    inst = inst.with_columns(pl.col("op").cast(pl.String)).with_columns(
        pl.col("op").fill_null("").str.contains(_P2P).alias("p2p")
    )
    # The op name is matched once per instance, not once per row; the group stays categorical for
    # the join back to the rows and becomes a plain string in the (small) instance table.
    arrival = inst.filter((pl.col("n") >= 2) & ~pl.col("p2p")).select([*KEYS, *back])
    value = "t_enter_ns" if aligned else "inside_ns"
    if aligned:
        wait = pl.col("last_enter") - pl.col("t_enter_ns")
        late = pl.col("t_enter_ns") - pl.col("median_enter")
    else:
        wait = pl.col("inside_ns") - pl.col("min_inside")
        late = pl.col("median_inside") - pl.col("inside_ns")
    # A rank's wait in one collective is the interval [t_enter, t_enter + wait] on its own clock (no
    # common clock needed). Collectives launched back to back (DDP buckets, FSDP prefetches on their
    # own streams) overlap: a rank held up 20 ms by one slow peer waits ~20 ms in each of them, so a
    # rank-step's wait is the union of its intervals, not their sum (the sum read as several times
    # the step). Only the columns needed travel through the join (memory bounds the chunk size).
    rs = ["rank", "step"]
    if not waits:  # the steps table has each rank's wait: lateness alone, a plain group-by
        arr = (
            c.lazy()
            .select(*rs, *KEYS, value)
            .join(arrival.lazy(), on=KEYS, how="inner")
            .group_by(rs)
            .agg(late.max().alias("late_ns"))
            .collect()
        )
        return inst.with_columns(pl.col("group").cast(pl.String)), arr
    intervals = (
        c.lazy()
        .select(*rs, *KEYS, *dict.fromkeys(["t_enter_ns", value]))
        .join(arrival.lazy(), on=KEYS, how="inner")
        .select(
            *rs,
            late.alias("late_ns"),
            pl.col("t_enter_ns").alias("a"),
            (pl.col("t_enter_ns") + wait.clip(lower_bound=0)).alias("b"),
        )
    )
    arr = interval_union(intervals, rs, maxes=["late_ns"])
    inst = inst.with_columns(pl.col("group").cast(pl.String))
    return inst, arr


def interval_union(
    frame: pl.DataFrame | pl.LazyFrame, by: Sequence[str], *, maxes: Sequence[str] = ()
) -> pl.DataFrame:
    """Per ``by`` group, the total length of the union of intervals ``[a, b]`` (``wait_ns``), the first
    start (``first_ns``), the last end (``last_ns``) and the largest value of each column in ``maxes``.

    One linear sweep over the rows when each group's rows are contiguous with ``a`` non-decreasing —
    the order the collectives are stored in (steps, then ranks, then seq, or ranks first) and that a
    row-order-keeping computation leaves them in. That is checked (O(n)); otherwise the frame is sorted
    on ``(*by, a)`` first. Frames the sweep cannot take (nulls, NaN, non-integer times) go through the
    general polars form; all three give the same numbers.
    """
    df = (frame.collect() if isinstance(frame, pl.LazyFrame) else frame).select(*by, "a", "b", *maxes)
    if not _sweepable(df, by, maxes):
        return _union_polars(df.lazy(), by, maxes).collect()
    out = _sweep(df, by, maxes)
    if out is None:  # rows not grouped and ordered: sort them (the general case, e.g. after a join)
        out = _sweep(df.sort([*by, "a"]), by, maxes)
    return out if out is not None else _union_polars(df.lazy(), by, maxes).collect()


def _union_polars(q: pl.LazyFrame, by: Sequence[str], maxes: Sequence[str]) -> pl.LazyFrame:
    """The general form: one sort on ``(*by, a)``, a running maximum of ``b`` per group, a group-by."""
    return (
        q.sort([*by, "a"])
        .with_columns(pl.col("b").cum_max().shift(1).over(by).alias("covered"))
        .group_by(by)
        .agg(
            (pl.col("b") - pl.max_horizontal("a", pl.col("covered").fill_null(pl.col("a"))))
            .clip(lower_bound=0)
            .sum()
            .alias("wait_ns"),
            pl.col("a").min().alias("first_ns"),
            pl.col("b").max().alias("last_ns"),
            *(pl.col(m).max() for m in maxes),
        )
    )


_SAFE = 1 << 61  # times within ±2^61 ns: differences of two of them fit in int64


def _sweepable(df: pl.DataFrame, by: Sequence[str], maxes: Sequence[str]) -> bool:
    if df.height == 0 or any(df[c].null_count() for c in df.columns):
        return False
    if not all(df[c].dtype.is_integer() for c in by) or {df["a"].dtype, df["b"].dtype} != {pl.Int64}:
        return False
    if not all(df[m].dtype.is_numeric() for m in maxes):
        return False
    if any(df[m].dtype.is_float() and bool(df[m].is_nan().any()) for m in maxes):
        return False
    a, b = df["a"].to_numpy(), df["b"].to_numpy()
    return bool((b >= a).all()) and int(a.min()) > -_SAFE and int(b.max()) < _SAFE


def _sweep(df: pl.DataFrame, by: Sequence[str], maxes: Sequence[str]) -> pl.DataFrame | None:
    """The union per group in one pass when rows come grouped with ``a`` ascending, else None."""
    n = df.height
    keys = [df[c].to_numpy() for c in by]
    a, b = df["a"].to_numpy(), df["b"].to_numpy()
    same = np.ones(n - 1, dtype=bool)  # row i+1 is in row i's group
    for k in keys:
        same &= k[1:] == k[:-1]
    # Groups are contiguous when the keys are sorted in some key order: check `by` and its reverse
    # (rank then step, or step then rank, for the collectives).
    if not (_lex_sorted(keys) or _lex_sorted(keys[::-1])):
        return None
    if not (~same | (a[1:] >= a[:-1])).all():
        return None
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    del same
    counts = np.diff(np.append(starts, n))
    first = a[starts]
    # A running maximum restarted at each group, without a loop: shift group g's values to
    # [g·S, g·S + S) (S > any b − first start within a group), so no earlier group's maximum reaches
    # them, then take one running maximum over all rows.
    width = int((b - np.repeat(first, counts)).max()) + 1
    if width * starts.size >= _SAFE:
        return None
    base = np.arange(starts.size, dtype=np.int64) * width - first  # g·S − first start of g
    run = np.repeat(base, counts)
    run += b
    np.maximum.accumulate(run, out=run)
    last = run[starts + counts - 1] - base
    # `covered`: what the group's earlier intervals cover, back in ns. For a group's first row it is
    # the previous group's shifted maximum minus this group's base: below `first`, so max(a, ·) = a.
    run[1:] = run[:-1]
    run[0] = -1  # below every shifted value: the first row's own start counts
    run -= np.repeat(base, counts)
    np.maximum(run, a, out=run)
    np.subtract(b, run, out=run)
    np.clip(run, 0, None, out=run)
    wait = np.add.reduceat(run, starts)
    del run
    idx = pl.Series(starts)
    cols = [df[c].gather(idx) for c in by]
    cols += [pl.Series("wait_ns", wait), pl.Series("first_ns", first), pl.Series("last_ns", last)]
    cols += [pl.Series(m, np.maximum.reduceat(df[m].to_numpy(), starts), dtype=df[m].dtype) for m in maxes]
    return pl.DataFrame(cols)


def _lex_sorted(keys: list[np.ndarray]) -> bool:
    """Rows in non-decreasing lexicographic order of ``keys``."""
    ahead = np.zeros(keys[0].size - 1, dtype=bool)
    tied = np.ones(keys[0].size - 1, dtype=bool)
    for k in keys:
        ahead |= tied & (k[1:] > k[:-1])
        tied &= k[1:] == k[:-1]
    return bool((ahead | tied).all())


# Collectives that no member can complete before every member entered: each needs every member's data
# (broadcast, reduce, gather and scatter can complete on some ranks early; point-to-point is not one).
_ALL_MEMBER = (
    r"(?i)(all[-_ ]?reduce|allreduce|all[-_ ]?gather|allgather|reduce[-_ ]?scatter|reducescatter"
    r"|all[-_ ]?to[-_ ]?all|alltoall|barrier)"
)


def inconsistent_groups(
    inst: pl.DataFrame, tol_ns: float, *, min_share: float = 0.05, min_count: int = 3
) -> pl.DataFrame:
    """Groups whose ``(group, seq)`` instances are not each one collective (aligned clocks only).

    In an all-member collective (all-reduce, all-gather, reduce-scatter, all-to-all, barrier) no rank
    completes before every rank has entered. When, in at least ``min_share`` of a group's instances
    that saw completions (and ``min_count`` of them), a rank left more than ``tol_ns`` before the last
    rank entered, the rows under that name are of different collectives — two process groups recorded
    under one name (an audit's DP subgroups {0,2} and {1,3}, both recorded as ``world``, drifted
    apart by up to 932 ms: rank 1 read as 138 ms late per step in 8–17 ms steps, "severity 1042%")
    — or their exits were stamped before completion. Either way neither their arrivals nor their
    transfers can be read. Returns group, instances, early_exits, max_gap_ns (empty when none)."""
    if inst.height == 0 or "last_enter" not in inst.columns:
        counts = {"instances": pl.UInt32, "early_exits": pl.UInt32, "max_gap_ns": pl.Int64}
        return pl.DataFrame(schema={"group": pl.String, **counts})
    cand = inst.filter(
        (pl.col("n") >= 2)
        & ~pl.col("p2p")
        & (pl.col("min_stay") > 0)
        & pl.col("op").fill_null("").str.contains(_ALL_MEMBER)
    )
    early = pl.col("min_exit") < pl.col("last_enter") - tol_ns
    per = cand.group_by("group").agg(
        pl.len().alias("instances"),
        early.sum().cast(pl.UInt32).alias("early_exits"),
        (pl.col("last_enter") - pl.col("min_exit")).max().alias("max_gap_ns"),
    )
    return per.filter(
        (pl.col("early_exits") >= min_count) & (pl.col("early_exits") >= min_share * pl.col("instances"))
    ).sort("group")


def _finish(inst: pl.DataFrame, aligned: bool) -> pl.DataFrame:
    """Transfer, skew and margin per instance, on the whole instance table."""
    inst = inst.sort(KEYS)
    if aligned:
        # A group's collectives run one after another (one stream / one gloo queue): an instance's
        # network time starts when all ranks arrived *and* the previous instance of the group finished,
        # so queueing behind earlier buckets is not counted as this bucket's transfer.
        inst = inst.with_columns(pl.col("min_exit").shift(1).over("group").alias("prev_exit"))
        return inst.with_columns(
            (pl.col("min_exit") - pl.max_horizontal("last_enter", pl.col("prev_exit").fill_null(0)))
            .clip(lower_bound=0)
            .alias("transfer_ns"),
            (pl.col("last_enter") - pl.col("median_enter")).alias("skew_ns"),
            (pl.col("last_enter") - pl.col("second_enter")).alias("margin_ns"),
        ).drop("prev_exit")
    return inst.with_columns(
        pl.col("min_inside").alias("transfer_ns"),
        (pl.col("median_inside") - pl.col("min_inside")).alias("skew_ns"),
        (pl.col("second_inside") - pl.col("min_inside")).alias("margin_ns"),
    )


def _pass(
    frames: Iterable[pl.DataFrame],
    aligned: bool,
    ranks: np.ndarray,
    steps: np.ndarray,
    waits: bool,
    skip: Collection[str] = (),
) -> tuple[_Grid, list[pl.DataFrame], list[pl.DataFrame], int]:
    grid = _Grid(ranks, steps)
    insts: list[pl.DataFrame] = []
    members: list[pl.DataFrame] = []
    rows = 0
    for frame in frames:
        if skip and frame.height:
            frame = frame.filter(~pl.col("group").cast(pl.String).fill_null("world").is_in(list(skip)))
        if frame.height == 0:
            continue
        grid.add_ranks(np.sort(frame["rank"].drop_nulls().unique().to_numpy().astype(np.int64)))
        pairs = frame.select(pl.col("group").fill_null("world"), "rank").unique()
        members.append(pairs.with_columns(pl.col("group").cast(pl.String)))
        usable = ("t_enter_ns", "t_exit_ns", "step")
        c = frame
        if any(frame[col].null_count() for col in usable):
            c = frame.filter(pl.all_horizontal(pl.col(col).is_not_null() for col in usable))
        if c.height == 0:
            continue
        rows += c.height
        inst, arr = _chunk(c, aligned, waits)
        insts.append(inst)
        zero = np.zeros(arr.height)
        grid.fold(
            arr["rank"].to_numpy().astype(np.int64),
            arr["step"].to_numpy().astype(np.int64),
            arr["late_ns"].cast(pl.Float64).to_numpy(),
            *(
                (arr[col].cast(pl.Float64).to_numpy() for col in ("wait_ns", "first_ns", "last_ns"))
                if waits
                else (zero, zero, zero)
            ),
        )
    return grid, insts, members, rows


def _split_span(inst: pl.DataFrame) -> int:
    """Steps spanned by instances that came out of two chunks (0 when none did)."""
    dup = inst.filter(pl.struct(KEYS).is_duplicated())
    if dup.height == 0:
        return 0
    span = dup.group_by(KEYS).agg((pl.col("step").max() - pl.col("step").min()).alias("span"))
    return int(span["span"].to_numpy().max()) + 1


def arrivals(
    source: StepChunks | pl.DataFrame,
    *,
    aligned: bool,
    ranks: np.ndarray,
    steps: np.ndarray,
    rows_per_chunk: int,
    progress: Callable[[int, int], None] | None = None,
    waits: bool = True,
    skip_groups: Collection[str] = (),
) -> Arrivals:
    """Stream ``source`` (or take an in-memory collectives frame) into instances and [rank, step] matrices.

    ``ranks``/``steps``: the matrices' axes (sorted); ranks found only in the collectives are added.
    ``progress(done, total)`` after each chunk. ``waits=False`` when the steps table has each rank's
    wait: the wait matrix (a sort per chunk) is then not built and ``Arrivals.wait`` is None.
    ``skip_groups``: groups whose rows are left out entirely (``inconsistent_groups``).
    """
    carry = 1
    while True:
        if isinstance(source, pl.DataFrame):
            frames: Iterable[pl.DataFrame] = [source]
            total = 1
        else:
            ranges = source.step_ranges(rows_per_chunk)
            total = len(ranges)
            frames = _frames(source, rows_per_chunk, carry, progress, total)
        grid, insts, members, rows = _pass(frames, aligned, ranks, steps, waits, skip_groups)
        inst = pl.concat(insts, how="vertical_relaxed") if insts else None
        span = _split_span(inst) if inst is not None and total > 1 else 0
        if span == 0:
            break
        # An instance spanned more steps than were held back: read again, holding back more; past the
        # run's length, in one piece (always whole).
        carry = max(carry + 1, span)
        assert isinstance(source, StepChunks)
        first, last = source.step_span or (0, 0)
        if carry > last - first:
            rows_per_chunk = source.rows + 1
    if progress and total == 1:
        progress(1, 1)
    seen = np.isfinite(grid.late)
    late = np.where(seen, grid.late, np.nan)
    wait = np.where(seen, grid.capped_wait(), np.nan) if waits else None
    member = (
        pl.concat(members).unique()
        if members
        else pl.DataFrame(schema={"group": pl.String, "rank": pl.Int32})
    )
    return Arrivals(
        ranks=grid.ranks,
        rows=rows,
        instances=_finish(inst, aligned) if inst is not None else None,
        late=late,
        wait=wait,
        members=member,
        chunks=total,
    )


def _frames(
    source: StepChunks,
    rows_per_chunk: int,
    carry: int,
    progress: Callable[[int, int], None] | None,
    total: int,
) -> Iterable[pl.DataFrame]:
    for i, (_lo, _hi, frame) in enumerate(source.chunks(rows_per_chunk, whole=KEYS, carry_steps=carry)):
        yield frame
        if progress:
            progress(i + 1, total)
