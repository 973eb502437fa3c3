"""The numbers behind the report's panels, computed from a run directory (vectorized polars/numpy).

For one collective instance, named by ``(group, seq)`` across ranks (DESIGN.md): the last arrival is
``max t_enter``; the arrival spread (skew) is ``last − first arrival``; the transfer is
``min t_exit − last``; the last arriver is the rank with the latest ``t_enter`` (ties: the lowest rank).
Instances seen by fewer than two ranks say nothing about arrival and are left out.

Per rank-step, the blocked time (``wait_ns``) splits into the time lost to late peers (blocked before
the last peer arrived: ``skew_waits``) and exposed transfer (the rest), as ``diagnose`` splits a step.
The run table, breakdown and scaling figure use the steps after the diagnosis's warm-up.

The collectives table is reduced chunk by chunk (``collective_stats`` over ``StepChunks``) to one row
per instance and one per rank-step, so the report of a run of any size fits in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from fabricpace.diagnose.arrivals import interval_union
from fabricpace.diagnose.scaling import SWEEP_SOURCES
from fabricpace.run.reader import DEFAULT_CHUNK_ROWS, RunData, StepChunks

MS = 1e6  # ns per ms


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """One row of the report's run table."""

    name: str
    source: str
    world_size: int
    nodes: int
    steps: int  # after the warm-up
    median_step_ms: float
    p95_step_ms: float
    cv: float
    instances: int
    median_skew_ms: float | None  # arrival spread (last − first arrival) per instance, median
    skew_share: float | None  # time lost to late peers per rank-step (``skew_waits``) / mean step time
    top_last_arriver: int | None
    top_last_share: float | None
    # The node whose ranks arrive last most often, when the run spans nodes and that node is last
    # more often than its share of the ranks would make it (a whole slow node; None otherwise).
    top_last_node: int | None = None
    top_last_node_share: float | None = None
    warmup: int = 0  # steps left out at the start (the diagnosis's warm-up)


def warmup_steps(n_steps: int) -> int:
    """The diagnosis's default warm-up (``DiagnoseConfig.warmup_steps`` None): min(20, steps / 10),
    at least 1, and never every step."""
    return max(0, min(min(20, max(1, n_steps // 10)), n_steps - 1))


def after_warmup(run: RunData, warmup: int | None) -> tuple[int | None, int]:
    """(first step kept, steps left out): the first ``warmup`` distinct steps are dropped (default:
    ``warmup_steps``), as the diagnosis drops them. (None, 0) for a run without steps."""
    if run.steps.height == 0:
        return None, 0
    steps = np.unique(run.steps["step"].drop_nulls().to_numpy())
    if steps.size == 0:
        return None, 0
    warm = warmup_steps(steps.size) if warmup is None else max(0, min(int(warmup), steps.size - 1))
    return int(steps[warm]), warm


def rank_ids(run: RunData) -> list[int]:
    """The run's ranks: from ranks.parquet, else from the steps."""
    frame = run.ranks if run.ranks.height else run.steps
    return sorted(int(r) for r in frame["rank"].unique().to_list())


def step_durations(run: RunData) -> pl.DataFrame:
    """rank, step, dur_ns and the step components, one row per rank-step."""
    s = run.steps
    if s.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int64, "dur_ns": pl.Int64})
    return s.with_columns((pl.col("t_end_ns") - pl.col("t_start_ns")).alias("dur_ns"))


def _step_times(d: pl.DataFrame) -> np.ndarray:
    """Step times (ns, median over ranks) of ``step_durations`` rows, in step order."""
    if d.height == 0:
        return np.zeros(0)
    return d.group_by("step").agg(pl.col("dur_ns").median()).sort("step")["dur_ns"].to_numpy()


def synchronized_step_ns(run: RunData) -> pl.DataFrame:
    """Per step: the job's step time = the median over ranks of each rank's step duration."""
    d = step_durations(run)
    if d.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "step_ns": pl.Float64})
    return d.group_by("step").agg(pl.col("dur_ns").median().alias("step_ns")).sort("step")


_INSTANCE_SCHEMA = {
    "group": pl.String, "seq": pl.Int64, "step": pl.Int64, "n": pl.UInt32,
    "skew_ns": pl.Int64, "transfer_ns": pl.Int64, "last_rank": pl.Int32,
}
_WAIT_SCHEMA = {"rank": pl.Int32, "step": pl.Int64, "skew_wait_ns": pl.Int64}
_ROWS_SCHEMA = {"rank": pl.Int32, "step": pl.Int64, "a": pl.Int64, "b": pl.Int64, "x": pl.Int64}
_UNION_SCHEMA = {**_WAIT_SCHEMA, "first_ns": pl.Int64, "last_ns": pl.Int64}
_NO_CUT = np.iinfo(np.int64).min
_SLICE_ROWS = 1 << 20  # rows cut and joined at a time (``skew_waits``)


@dataclass(frozen=True, kw_only=True)
class CollectiveStats:
    """What the report needs from the collectives table: one row per instance seen by two or more
    ranks, and the skew wait per rank-step. Both are small next to the table itself."""

    instances: pl.DataFrame  # group, seq, step, n, skew_ns, transfer_ns, last_rank
    waits: pl.DataFrame  # rank, step, skew_wait_ns


def _chunk_rows(c: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Instances (all, with their last arrival) of a frame of whole instances, and per row of an
    instance seen by two or more ranks the part of the rank's time in it spent before the last arrival:
    ``a`` = its arrival, ``b`` = the last arrival but not past its own exit (a DDP arrival marker, whose
    completion was not seen, has ``t_exit = t_enter``: it claims nothing), ``x`` = its exit."""
    keys = ["group", "seq"]
    t = pl.col("t_enter_ns")
    narrow = c.select(*keys, "rank", "step", "t_enter_ns", "t_exit_ns")
    # Each row with its instance's last arrival and size, from a window: it keeps the rows in their
    # stored order (grouped by rank-step, t_enter rising), which the wait union below relies on.
    win = narrow.with_columns(t.max().over(keys).alias("last_enter"), pl.len().over(keys).alias("n"))
    inst = narrow.group_by(keys).agg(
        pl.len().alias("n"),
        (t.max() - t.min()).alias("skew_ns"),
        (pl.col("t_exit_ns").min() - t.max()).clip(lower_bound=0).alias("transfer_ns"),
    )
    # The last arriver is the latest t_enter (ties: the lowest rank); the instance's step is its row's.
    # Only the rows at their instance's last arrival are sorted (about one per instance), not all rows.
    if narrow["t_enter_ns"].null_count():  # nulls sort first: keep the whole-frame sort's answer
        last = narrow.sort(["t_enter_ns", "rank"], descending=[True, False])
    else:
        last = win.filter(t == pl.col("last_enter")).sort("rank")
    last = last.group_by(keys).agg(pl.col("step").first(), pl.col("rank").first().alias("last_rank"))
    inst = inst.join(last, on=keys, how="left", nulls_equal=True).select(
        pl.col("group").cast(pl.String), "seq", "step", "n", "skew_ns", "transfer_ns", "last_rank"
    )
    del last
    # Rows with a null key belong to no instance and take no part.
    rows = win.filter(
        pl.col("group").is_not_null() & pl.col("seq").is_not_null() & (pl.col("n") >= 2) & t.is_not_null()
    ).select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64), t.alias("a"),
        pl.max_horizontal(t, pl.min_horizontal("last_enter", "t_exit_ns")).alias("b"),
        pl.col("t_exit_ns").alias("x"),
    )
    return inst, rows


def _unique_pairs(rank: np.ndarray, step: np.ndarray) -> bool:
    """No (rank, step) twice: the runs of equal rank-steps found in the rows are whole rank-steps."""
    if rank.size < 2:
        return True
    r = rank.astype(np.int64)
    lo = int(r.min())
    key = step.astype(np.int64) * (int(r.max()) - lo + 1) + (r - lo)
    return bool(np.unique(key).size == key.size)


@dataclass(frozen=True)
class Blocked:
    """Per rank-step of the steps table: the blocked time (``wait_ns``) and the time collectives were
    in flight (``comm_ns``), for ``skew_waits`` (looked up by a sorted key, not joined per chunk)."""

    frame: pl.DataFrame  # rank, step, wait_ns, comm_ns (nulls where unknown)
    width: int  # key = step · width + rank
    keys: np.ndarray  # sorted
    wait: np.ndarray  # ns, -1 where unknown
    comm: np.ndarray  # ns, -1 where unknown

    def lookup(self, rank: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(wait, comm) of these rank-steps; -1 where the steps table has no row or no value."""
        if self.keys.size == 0:
            return np.full(rank.size, -1, dtype=np.int64), np.full(rank.size, -1, dtype=np.int64)
        rank = rank.astype(np.int64)
        key = step.astype(np.int64) * self.width + rank
        i = np.minimum(np.searchsorted(self.keys, key), self.keys.size - 1)
        hit = (rank >= 0) & (rank < self.width) & (self.keys[i] == key)
        return np.where(hit, self.wait[i], -1), np.where(hit, self.comm[i], -1)


def block_frame(steps: pl.DataFrame) -> Blocked | None:
    """The steps table's blocked and in-flight times per rank-step (None without a wait column): what
    the skew wait is cut to (``skew_waits``)."""
    if steps.height == 0 or "wait_ns" not in steps.columns:
        return None
    comm = pl.col("comm_ns") if "comm_ns" in steps.columns else pl.lit(None)
    frame = steps.select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64),
        pl.col("wait_ns").cast(pl.Int64), comm.cast(pl.Int64).alias("comm_ns"),
    ).drop_nulls(["rank", "step"]).unique(["rank", "step"], keep="first")
    ok = frame.filter(pl.col("rank") >= 0)
    width = int(ok["rank"].cast(pl.Int64).to_numpy().max()) + 1 if ok.height else 1
    ok = ok.with_columns((pl.col("step") * width + pl.col("rank")).alias("key")).sort("key")
    return Blocked(
        frame=frame, width=width, keys=ok["key"].to_numpy(),
        wait=ok["wait_ns"].fill_null(-1).clip(lower_bound=-1).to_numpy(),
        comm=ok["comm_ns"].fill_null(-1).clip(lower_bound=-1).to_numpy(),
    )


def skew_waits(rows: pl.DataFrame, block: Blocked | None) -> pl.DataFrame:
    """rank, step, skew_wait_ns, first_ns, last_ns: per rank-step, the time the rank was *blocked*
    before its last peer arrived.

    A rank's skew intervals ``[t_enter, last arrival]`` (cut at its own exit) are joined into one set:
    DDP launches its buckets back to back, so they overlap, and a rank held up 20 ms by a slow peer
    shows ~20 ms at each bucket; the time it waited is their union, not their sum. But that union spans
    the backward pass, where the rank computes while its buckets are in flight, not only the time it
    was blocked. The steps table says how long it was blocked (``wait_ns``): when its collectives were
    in flight longer than that (``comm_ns > wait_ns``: they overlapped its compute), the blocked time
    is the last ``wait_ns`` before its last exit, and only the union's part inside it counts (on the
    16-node paper scenario 34 of the 101 ms a rank is blocked per step; the union read 100 ms, leaving
    no transfer). When they were not (blocking collectives; DDP's hook-free mode, whose earlier buckets
    are arrival markers), the union is already blocked time. Either way it is at most ``wait_ns``; the
    rest of ``wait_ns`` is exposed transfer. Without a ``wait_ns`` (some imports), the union as it is."""
    rs = ["rank", "step"]
    if rows.height == 0:
        return pl.DataFrame(schema=_UNION_SCHEMA)
    if block is None:
        return _union(rows)
    n = rows.height
    rank, step = rows["rank"].to_numpy(), rows["step"].to_numpy()
    starts = np.concatenate(([0], np.flatnonzero((rank[1:] != rank[:-1]) | (step[1:] != step[:-1])) + 1))
    if not _unique_pairs(rank[starts], step[starts]):  # rank-steps not contiguous: sort them
        rows = rows.sort([*rs, "a"])
        rank, step = rows["rank"].to_numpy(), rows["step"].to_numpy()
        starts = np.concatenate(([0], np.flatnonzero((rank[1:] != rank[:-1]) | (step[1:] != step[:-1])) + 1))
    xs = rows["x"]
    tx = np.maximum.reduceat((xs.fill_null(_NO_CUT) if xs.null_count() else xs).to_numpy(), starts)
    wait, comm = block.lookup(rank[starts], step[starts])
    cuts = np.where((wait >= 0) & (comm > wait) & (tx > _NO_CUT), tx - np.maximum(wait, 0), _NO_CUT)
    counts = np.diff(np.append(starts, n))
    a_all, b_all = rows["a"].to_numpy(), rows["b"].to_numpy()
    # Cut and joined a slice of whole rank-steps at a time: the cut intervals of a 4 M-row chunk at
    # once cost 100 MB more than the report took before.
    first_group = np.unique(np.searchsorted(starts, np.arange(0, n, _SLICE_ROWS), side="right") - 1)
    bounds = [*first_group.tolist(), len(starts)]
    parts = []
    for g0, g1 in itertools.pairwise(bounds):
        lo = int(starts[g0])
        hi = int(starts[g1]) if g1 < len(starts) else n
        a = np.repeat(cuts[g0:g1], counts[g0:g1])  # the rank-step's cut, per row
        np.maximum(a, a_all[lo:hi], out=a)
        b = np.maximum(b_all[lo:hi], a)
        part = pl.DataFrame({"rank": rows["rank"][lo:hi], "step": rows["step"][lo:hi], "a": a, "b": b})
        del a, b
        parts.append(_union(part))
    return pl.concat(parts)


def _union(rows: pl.DataFrame) -> pl.DataFrame:
    out = interval_union(rows.select("rank", "step", "a", "b"), ["rank", "step"])
    return out.select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int64),
        pl.col("wait_ns").cast(pl.Int64).alias("skew_wait_ns"),
        pl.col("first_ns").cast(pl.Int64), pl.col("last_ns").cast(pl.Int64),
    )


def _chunk_stats(
    c: pl.DataFrame, block: Blocked | None = None
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Instances and rank-step skew waits (``skew_waits``) of a frame of whole instances."""
    inst, rows = _chunk_rows(c)
    return inst, skew_waits(rows, block)


def collective_stats(
    source: RunData | StepChunks,
    *,
    steps: pl.DataFrame | None = None,
    rows_per_chunk: int = DEFAULT_CHUNK_ROWS,
    progress: Callable[[int, int], None] | None = None,
) -> CollectiveStats:
    """Instances and skew waits of a run: from ``run.collectives`` when given a loaded run, else read
    chunk by chunk (instances kept whole across chunks), so memory stays bounded for any run size.

    ``steps``: the run's steps table (``run.steps`` when given a loaded run), whose ``wait_ns`` is the
    blocked time the skew wait is part of (``skew_waits``)."""
    frames: Iterable[tuple[int | None, pl.DataFrame]]
    if isinstance(source, StepChunks):
        total = len(source.step_ranges(rows_per_chunk))
        frames = ((hi, f) for _lo, hi, f in source.chunks(rows_per_chunk, whole=("group", "seq")))
    else:
        total, frames = 1, [(None, source.collectives)]
        if steps is None:
            steps = source.steps
    block = block_frame(steps) if steps is not None else None
    insts, waits = [], []
    # A rank-step's rows can sit in two chunks: an instance counted in step s by some ranks and s + 1
    # by others is handed out with the next chunk. Its skew wait needs all of them (the cut is at the
    # rank-step's last exit), so the rows of a chunk's last two steps wait for the next chunk.
    carry = pl.DataFrame(schema=_ROWS_SCHEMA)
    prev_hi: int | None = None
    for i, (hi, frame) in enumerate(frames):
        rows = pl.DataFrame(schema=_ROWS_SCHEMA)
        if frame.height:
            inst, rows = _chunk_rows(frame)
            insts.append(inst)
        open_from = hi - 1 if hi is not None and i + 1 < total else None  # None: the last chunk
        step = pl.col("step")
        edge = pl.lit(False)
        if prev_hi is not None:
            edge = edge | (step <= prev_hi)
        if open_from is not None:
            edge = edge | (step >= open_from)
        if rows.height:
            waits.append(skew_waits(rows, block).filter(~edge))
        small = pl.concat([carry, rows.filter(edge)])
        carry = small.filter(step >= open_from) if open_from is not None else carry.clear()
        if open_from is not None:
            small = small.filter(step < open_from)
        if small.height:
            waits.append(skew_waits(small, block))
        del rows, small  # (one chunk's rows at a time: not kept while the next chunk is read)
        prev_hi = hi
        if progress:
            progress(i + 1, total)
    if carry.height:  # (chunks ended early)
        waits.append(skew_waits(carry, block))
    if not insts:
        return CollectiveStats(
            instances=pl.DataFrame(schema=_INSTANCE_SCHEMA), waits=pl.DataFrame(schema=_WAIT_SCHEMA)
        )
    inst = pl.concat(insts).filter(pl.col("n") >= 2).sort(["step", "group", "seq"])
    # A rank-step whose instances spanned more than two steps may still come in two parts: their
    # unions add up, but never to more than the time from the first arrival to the last, nor to more
    # than the time the rank was blocked.
    if not waits:  # (a one-rank run: instances, but no rank waits for another)
        return CollectiveStats(instances=inst, waits=pl.DataFrame(schema=_WAIT_SCHEMA))
    wait = (
        pl.concat(waits)
        .group_by(["rank", "step"])
        .agg(
            pl.min_horizontal(
                pl.col("skew_wait_ns").sum(), pl.col("last_ns").max() - pl.col("first_ns").min()
            ).alias("skew_wait_ns")
        )
    )
    if block is not None:
        w = pl.col("wait_ns")
        blocked = block.frame.select("rank", "step", "wait_ns")
        wait = wait.join(blocked, on=["rank", "step"], how="left").select(
            "rank", "step",
            pl.when(w.is_null()).then(pl.col("skew_wait_ns"))
            .otherwise(pl.min_horizontal("skew_wait_ns", w.clip(lower_bound=0))).alias("skew_wait_ns"),
        )
    wait = wait.select(*(pl.col(k).cast(v) for k, v in _WAIT_SCHEMA.items()))
    return CollectiveStats(instances=inst, waits=wait)


def instances(run: RunData) -> pl.DataFrame:
    """One row per collective instance: group, seq, step, n, skew_ns, transfer_ns, last_rank."""
    return collective_stats(run).instances


def rank_waits(run: RunData) -> pl.DataFrame:
    """Per rank-step: skew wait, the time the rank was blocked before its last peer arrived
    (``skew_waits``)."""
    return collective_stats(run).waits


def last_arriver_share(inst: pl.DataFrame, ranks: list[int]) -> pl.DataFrame:
    """Share of instances (with skew > 0) in which each rank arrived last; every rank gets a row."""
    base = pl.DataFrame({"rank": pl.Series(ranks, dtype=pl.Int32)})
    with_skew = inst.filter(pl.col("skew_ns") > 0)
    total = max(with_skew.height, 1)
    counts = with_skew.group_by("last_rank").agg(pl.len().alias("count")).rename({"last_rank": "rank"})
    return (
        base.join(counts.with_columns(pl.col("rank").cast(pl.Int32)), on="rank", how="left")
        .with_columns(pl.col("count").fill_null(0))
        .with_columns((pl.col("count") / total).alias("share"))
        .sort("rank")
    )


def breakdown(
    run: RunData, waits: pl.DataFrame | None = None, *, from_step: int | None = None
) -> pl.DataFrame:
    """Per rank, mean per step (ms): compute, skew wait (blocked before the last peer arrived), transfer
    (the rest of the blocked time: exposed communication), data, gc, paced and other (the rest of the
    step). ``waits``: ``CollectiveStats.waits`` when already known; ``from_step``: the first step
    counted (after the warm-up)."""
    d = step_durations(run)
    if from_step is not None and d.height:
        d = d.filter(pl.col("step") >= from_step)
    if d.height == 0:
        return pl.DataFrame()
    w = rank_waits(run) if waits is None else waits
    d = d.join(w, on=["rank", "step"], how="left").with_columns(pl.col("skew_wait_ns").fill_null(0))
    names = ("compute_ns", "wait_ns", "data_ns", "gc_ns", "paced_ns")
    cols = {c: pl.col(c).fill_null(0).cast(pl.Float64) for c in names}
    skew = pl.min_horizontal(pl.col("skew_wait_ns").cast(pl.Float64), cols["wait_ns"])
    d = d.with_columns(
        cols["compute_ns"].alias("compute"),
        skew.alias("skew_wait"),
        (cols["wait_ns"] - skew).clip(lower_bound=0).alias("transfer"),
        cols["data_ns"].alias("data"),
        cols["gc_ns"].alias("gc"),
        cols["paced_ns"].alias("paced"),
    )
    parts = ["compute", "skew_wait", "transfer", "data", "gc", "paced"]
    rest = pl.col("dur_ns").cast(pl.Float64) - pl.sum_horizontal(parts)
    d = d.with_columns(rest.clip(lower_bound=0).alias("other"))
    return (
        d.group_by("rank")
        .agg([(pl.col(p).mean() / MS).alias(p) for p in [*parts, "other"]])
        .sort("rank")
    )


HEATMAP_VALUES = {"dur_ns": "step time", "compute_ns": "own compute", "skew_wait_ns": "lost to late peers"}


def heatmap_matrices(
    run: RunData, *, max_cols: int = 300, waits: pl.DataFrame | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], int]:
    """(ranks, step labels, {value: matrix [R, C] in ms}, steps per column); steps binned to ≤ max_cols.

    Values: step time (identical across ranks under synchronous training), own compute and skew wait
    (these two show who holds the others up).
    """
    d = step_durations(run)
    if d.height == 0:
        return np.zeros(0, int), np.zeros(0, int), {}, 1
    w = rank_waits(run) if waits is None else waits
    d = d.join(w, on=["rank", "step"], how="left") if w.height else d.with_columns(
        pl.lit(None, dtype=pl.Int64).alias("skew_wait_ns"))
    ranks = np.sort(d["rank"].unique().to_numpy())
    steps = np.sort(d["step"].unique().to_numpy())
    per_col = max(1, int(np.ceil(len(steps) / max_cols)))
    r_idx = np.searchsorted(ranks, d["rank"].to_numpy())
    c_idx = np.searchsorted(steps, d["step"].to_numpy()) // per_col
    ncol = int(np.ceil(len(steps) / per_col))
    out: dict[str, np.ndarray] = {}
    for col in HEATMAP_VALUES:
        if col not in d.columns or d[col].null_count() == d.height:
            continue
        vals = d[col].fill_null(0).to_numpy().astype(np.float64) / MS
        total = np.zeros((len(ranks), ncol))
        count = np.zeros((len(ranks), ncol))
        np.add.at(total, (r_idx, c_idx), vals)
        np.add.at(count, (r_idx, c_idx), 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[col] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return ranks, steps[::per_col], out, per_col


def last_arriver_node(inst: pl.DataFrame, run: RunData) -> tuple[int, float] | None:
    """(node, share of instances with skew whose last arriver sits on it) for the node that is last
    most often — when the run spans several nodes and that node is last in at least 1.5× its share of
    the ranks (a slow node spreads "last" over its ranks, so no single rank stands out)."""
    info = run.ranks
    if info.height == 0 or "node" not in info.columns or info["node"].drop_nulls().n_unique() < 2:
        return None
    with_skew = inst.filter(pl.col("skew_ns") > 0).select(pl.col("last_rank").cast(pl.Int64).alias("rank"))
    if with_skew.height == 0:
        return None
    nodes = info.select(pl.col("rank").cast(pl.Int64), pl.col("node").cast(pl.Int64)).drop_nulls()
    counts = (
        with_skew.join(nodes, on="rank", how="inner").group_by("node").agg(pl.len().alias("n"))
        .sort(["n", "node"], descending=[True, False])
    )
    if counts.height == 0:
        return None
    node, n = counts.row(0)
    share = n / with_skew.height
    expected = nodes.filter(pl.col("node") == node).height / max(nodes.height, 1)
    return (int(node), float(share)) if share >= 1.5 * expected else None


def summarize(
    run: RunData, name: str, stats: CollectiveStats | None = None, *, warmup: int | None = None
) -> RunSummary:
    """The run table row: step statistics, arrival skew and the most frequent last arriver, all over
    the steps after the warm-up (``warmup`` steps, default the diagnosis's: ``warmup_steps``)."""
    first, warm = after_warmup(run, warmup)
    stats = stats or collective_stats(run)
    inst, w, d = stats.instances, stats.waits, step_durations(run)
    if first is not None:
        kept = pl.col("step") >= first
        inst, w, d = inst.filter(kept), w.filter(kept), d.filter(kept)
    sync = _step_times(d)
    ranks = rank_ids(run)
    share = last_arriver_share(inst, ranks) if inst.height else None
    skew_share = None
    if w.height and d.height and len(sync):
        mean_wait = float(d.select("rank", "step").join(w, on=["rank", "step"], how="left")["skew_wait_ns"]
                          .fill_null(0).sum()) / d.height
        skew_share = mean_wait / max(float(np.mean(sync)), 1.0)
    top = None
    if share is not None and share["count"].sum():
        top = share.sort(["share", "rank"], descending=[True, False]).row(0, named=True)
    node = last_arriver_node(inst, run) if inst.height else None
    return RunSummary(
        name=name,
        source=run.manifest.source,
        world_size=run.world_size,
        nodes=int(run.manifest.nodes),
        steps=len(sync),
        median_step_ms=float(np.median(sync) / MS) if len(sync) else float("nan"),
        p95_step_ms=float(np.percentile(sync, 95) / MS) if len(sync) else float("nan"),
        cv=float(np.std(sync) / np.mean(sync)) if len(sync) > 1 and np.mean(sync) > 0 else float("nan"),
        instances=inst.height,
        median_skew_ms=float(np.median(inst["skew_ns"].to_numpy()) / MS) if inst.height else None,
        skew_share=skew_share,
        top_last_arriver=int(top["rank"]) if top else None,
        top_last_share=float(top["share"]) if top else None,
        top_last_node=node[0] if node else None,
        top_last_node_share=node[1] if node else None,
        warmup=warm,
    )


def scaling_rows(
    runs: list[tuple[str, RunData]],
    waits: list[pl.DataFrame] | None = None,
    warmups: list[int | None] | None = None,
) -> pl.DataFrame:
    """One row per run, ordered by world size: mean step time after the warm-up and where it goes (ms:
    compute, time lost to late peers, exposed transfer, each the mean over ranks and steps), and
    efficiency — the numbers ``diagnose`` compares across runs.

    Efficiency assumes weak scaling (fixed per-rank batch): throughput ∝ N / step time, so efficiency
    against the smallest run is its step time over this run's step time.
    """
    rows = []
    for i, (name, run) in enumerate(runs):
        first, _warm = after_warmup(run, warmups[i] if warmups is not None else None)
        d = step_durations(run)
        if first is not None:
            d = d.filter(pl.col("step") >= first)
        sync = _step_times(d)
        b = breakdown(run, waits[i] if waits is not None else None, from_step=first)
        keys = ("compute", "skew_wait", "transfer")
        parts = {p: float(np.mean(b[p].to_numpy())) for p in keys} if b.height else {}
        rows.append({
            "run": name, "world_size": run.world_size, "nodes": int(run.manifest.nodes),
            "step_ms": float(np.mean(sync) / MS) if len(sync) else float("nan"),
            **{f"{p}_ms": v for p, v in parts.items()},
        })
    df = pl.DataFrame(rows).sort("world_size")
    base = df.row(0, named=True)
    return df.with_columns(
        (base["step_ms"] / pl.col("step_ms")).alias("efficiency"),
        (pl.col("world_size") / pl.col("step_ms") * 1000.0).alias("rank_steps_per_s"),
    )


# Runs whose "steps" are the message sizes of a sweep: diagnose's own list, so the two never disagree.
SIZE_SWEEP_SOURCES = SWEEP_SOURCES


def is_size_sweep(run: RunData) -> bool:
    """An nccl-tests import: one step per message size, a description of the fabric, not a training run
    (step-time statistics over it would describe the sizes)."""
    return run.manifest.source in SIZE_SWEEP_SOURCES


def size_sweep_rows(run: RunData, name: str) -> pl.DataFrame:
    """Per message size of a size sweep (``run`` with steps and collectives): op, bytes, time (ms,
    median over ranks of the step) and algorithm bandwidth (bytes / time, GB/s) — the numbers
    ``diagnose`` lists in metrics.size_sweep — and nccl-tests' own bus bandwidth (GB/s, null when the
    import has none)."""
    t0, t1 = pl.col("t_start_ns"), pl.col("t_end_ns")
    times = (
        run.steps.filter(t0.is_not_null() & t1.is_not_null())
        .group_by("step")
        .agg((t1 - t0).median().cast(pl.Float64).alias("ns"))
    )
    c = run.collectives
    busbw = pl.col("busbw_gbps").cast(pl.Float64) if "busbw_gbps" in c.columns else pl.lit(None, pl.Float64)
    shape = c.group_by("step").agg(pl.col("op").first(), pl.col("bytes").max(), busbw.median().alias("busbw"))
    ok = pl.col("bytes").is_not_null() & (pl.col("ns") > 0)
    rows = shape.join(times, on="step").filter(ok).sort("step")
    return rows.select(
        pl.lit(name).alias("run"),
        pl.lit(run.world_size).cast(pl.Int64).alias("world_size"),
        pl.lit(int(run.manifest.nodes)).cast(pl.Int64).alias("nodes"),
        "step",
        pl.col("op").cast(pl.String),
        pl.col("bytes").cast(pl.Int64),
        (pl.col("ns") / 1e6).alias("time_ms"),
        (pl.col("bytes") / pl.col("ns")).alias("algbw_gbytes_s"),
        pl.col("busbw").cast(pl.Float64).alias("busbw_gbytes_s"),
    )

