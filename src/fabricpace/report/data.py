"""The numbers behind the report's panels, computed from a run directory (vectorized polars/numpy).

For one collective instance, named by ``(group, seq)`` across ranks (DESIGN.md): the last arrival is
``max t_enter``; each rank's skew wait is ``last − t_enter``; the transfer is ``min t_exit − last``; the
last arriver is the rank with the latest ``t_enter`` (ties: the lowest rank). Instances seen by fewer
than two ranks say nothing about arrival and are left out.

The collectives table is reduced chunk by chunk (``collective_stats`` over ``StepChunks``) to one row
per instance and one per rank-step, so the report of a run of any size fits in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from fabricpace.diagnose.arrivals import interval_union
from fabricpace.run.reader import DEFAULT_CHUNK_ROWS, RunData, StepChunks

MS = 1e6  # ns per ms


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """One row of the report's run table."""

    name: str
    source: str
    world_size: int
    nodes: int
    steps: int
    median_step_ms: float
    p95_step_ms: float
    cv: float
    instances: int
    median_skew_ms: float | None
    skew_share: float | None  # mean skew wait per rank-step (overlaps once, ≤ wait_ns) / mean step time
    top_last_arriver: int | None
    top_last_share: float | None
    # The node whose ranks arrive last most often, when the run spans nodes and that node is last
    # more often than its share of the ranks would make it (a whole slow node; None otherwise).
    top_last_node: int | None = None
    top_last_node_share: float | None = None


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


@dataclass(frozen=True, kw_only=True)
class CollectiveStats:
    """What the report needs from the collectives table: one row per instance seen by two or more
    ranks, and the skew wait per rank-step. Both are small next to the table itself."""

    instances: pl.DataFrame  # group, seq, step, n, skew_ns, transfer_ns, last_rank
    waits: pl.DataFrame  # rank, step, skew_wait_ns


def _chunk_stats(c: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Instances (all, with their last arrival) and rank-step waits of a frame of whole instances."""
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
    # A rank's skew wait in one collective is [t_enter, last arrival]. DDP launches its buckets one
    # after another without waiting, so these intervals overlap: a rank held up 20 ms by a slow peer
    # shows ~20 ms at each of a step's buckets. The time it waited is their union, not their sum
    # (the sum over 4 buckets read as 139% of the step on the README's ex1 run). Rows with a null key
    # belong to no instance and take no part.
    rs = ["rank", "step"]
    intervals = win.filter(
        pl.col("group").is_not_null() & pl.col("seq").is_not_null() & (pl.col("n") >= 2)
    ).select(*rs, t.alias("a"), pl.max_horizontal("t_enter_ns", "last_enter").alias("b"))
    del win
    waits = interval_union(intervals, rs).rename({"wait_ns": "skew_wait_ns"})
    return inst, waits


def collective_stats(
    source: RunData | StepChunks,
    *,
    rows_per_chunk: int = DEFAULT_CHUNK_ROWS,
    progress: Callable[[int, int], None] | None = None,
) -> CollectiveStats:
    """Instances and skew waits of a run: from ``run.collectives`` when given a loaded run, else read
    chunk by chunk (instances kept whole across chunks), so memory stays bounded for any run size."""
    frames: Iterable[pl.DataFrame]
    if isinstance(source, StepChunks):
        total = len(source.step_ranges(rows_per_chunk))
        frames = (f for _lo, _hi, f in source.chunks(rows_per_chunk, whole=("group", "seq")))
    else:
        total, frames = 1, [source.collectives]
    insts, waits = [], []
    for i, frame in enumerate(frames):
        if frame.height:
            inst, wait = _chunk_stats(frame)
            insts.append(inst)
            waits.append(wait)
        if progress:
            progress(i + 1, total)
    if not insts:
        return CollectiveStats(
            instances=pl.DataFrame(schema=_INSTANCE_SCHEMA), waits=pl.DataFrame(schema=_WAIT_SCHEMA)
        )
    inst = pl.concat(insts).filter(pl.col("n") >= 2).sort(["step", "group", "seq"])
    # A rank-step's collectives may sit in two chunks (an instance held back for the next one): the
    # parts' unions add up, but never to more than the time from the first arrival to the last.
    wait = (
        pl.concat(waits)
        .group_by(["rank", "step"])
        .agg(
            pl.min_horizontal(
                pl.col("skew_wait_ns").sum(), pl.col("last_ns").max() - pl.col("first_ns").min()
            ).alias("skew_wait_ns")
        )
    )
    return CollectiveStats(instances=inst, waits=wait)


def instances(run: RunData) -> pl.DataFrame:
    """One row per collective instance: group, seq, step, n, skew_ns, transfer_ns, last_rank."""
    return collective_stats(run).instances


def rank_waits(run: RunData) -> pl.DataFrame:
    """Per rank-step: skew wait (time waiting for later peers) over that step's collectives, where
    waits that overlap in time (buckets in flight together) are counted once."""
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


def breakdown(run: RunData, waits: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per rank, mean per step (ms): compute, skew wait, transfer (exposed comm beyond skew), data, gc,
    paced and other (the rest of the step). ``waits``: ``CollectiveStats.waits`` when already known."""
    d = step_durations(run)
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


HEATMAP_VALUES = {"dur_ns": "step time", "compute_ns": "own compute", "skew_wait_ns": "wait for peers"}


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


def blocked_wait(d: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """rank, step, skew_wait_ns: the union of a rank-step's skew-wait intervals, capped by the time the
    steps table says the rank was blocked (``wait_ns``) where it has one. DDP launches ~200 buckets a
    step about 1 ms apart, each waiting 12–20 ms for its last arrival: their union spans the whole
    backward pass (62% of a 2-node paper-scenario step whose recorded wait was 5%), not time blocked."""
    j = d.select("rank", "step", *(["wait_ns"] if "wait_ns" in d.columns else [])).join(
        waits, on=["rank", "step"], how="left"
    )
    sw = pl.col("skew_wait_ns").fill_null(0).cast(pl.Float64)
    if "wait_ns" in j.columns:
        sw = pl.when(pl.col("wait_ns").is_null()).then(sw).otherwise(
            pl.min_horizontal(sw, pl.col("wait_ns").cast(pl.Float64).clip(lower_bound=0))
        )
    return j.select("rank", "step", sw.alias("skew_wait_ns"))


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


def summarize(run: RunData, name: str, stats: CollectiveStats | None = None) -> RunSummary:
    """The run table row: step statistics, arrival skew and the most frequent last arriver."""
    sync = synchronized_step_ns(run)["step_ns"].to_numpy()
    stats = stats or collective_stats(run)
    inst = stats.instances
    ranks = rank_ids(run)
    share = last_arriver_share(inst, ranks) if inst.height else None
    w = stats.waits
    d = step_durations(run)
    skew_share = None
    if w.height and d.height:
        mean_wait = float(blocked_wait(d, w)["skew_wait_ns"].sum()) / max(d.height, 1)
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
    )


def scaling_rows(
    runs: list[tuple[str, RunData]], waits: list[pl.DataFrame] | None = None
) -> pl.DataFrame:
    """One row per run, ordered by world size: median step time and where it goes (ms), efficiency.

    Efficiency assumes weak scaling (fixed per-rank batch): throughput ∝ N / step time, so efficiency
    against the smallest run is its step time over this run's step time.
    """
    rows = []
    for i, (name, run) in enumerate(runs):
        sync = synchronized_step_ns(run)["step_ns"].to_numpy()
        b = breakdown(run, waits[i] if waits is not None else None)
        keys = ("compute", "skew_wait", "transfer")
        parts = {p: float(np.mean(b[p].to_numpy())) for p in keys} if b.height else {}
        rows.append({
            "run": name, "world_size": run.world_size, "nodes": int(run.manifest.nodes),
            "step_ms": float(np.median(sync) / MS) if len(sync) else float("nan"),
            **{f"{p}_ms": v for p, v in parts.items()},
        })
    df = pl.DataFrame(rows).sort("world_size")
    base = df.row(0, named=True)
    return df.with_columns(
        (base["step_ms"] / pl.col("step_ms")).alias("efficiency"),
        (pl.col("world_size") / pl.col("step_ms") * 1000.0).alias("rank_steps_per_s"),
    )
