"""Per-run metrics the detectors share: dense rank × step matrices and per-collective-instance timing.

For one collective instance (``group``, ``seq``): ``last = max_r t_enter``, each rank's wait
``last − t_enter_r``, the transfer ``min_r t_exit − last`` and the last arriver (DESIGN.md). When the
ranks' clocks are not known to be aligned (several hosts and no ``clock_err_ns``), arrivals are read
from each rank's own time inside the collective instead — ``t_exit − t_enter`` is a duration on one
clock, and every rank leaves a collective at about the same moment, so the rank with the shortest stay
arrived last. That basis is immune to clock offsets, at the price of the (small) spread of exit times.

Everything is vectorized: polars group-bys over instances, numpy over dense [rank, step] matrices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.stats import nanmedian
from fabricpace.run.reader import RunData

# Point-to-point transfers (pipeline sends/receives) wait on the pipeline schedule, not on a slow peer:
# they are kept for transfer/contention but left out of arrival skew.
_P2P = r"(?i)(send|recv|p2p|pp[-_ ]?comm|isend|irecv)"


@dataclass(kw_only=True)
class RunMetrics:
    """Dense views of one run after warm-up. Matrices are [rank, step]; NaN where a row is missing."""

    run: RunData
    path: str
    ranks: np.ndarray  # rank ids (row order)
    steps: np.ndarray  # step ids (column order), warm-up removed
    warmup: int
    step_time: np.ndarray  # [S] ns: median over ranks of t_end − t_start
    duration: np.ndarray  # [R, S]
    components: dict[str, np.ndarray]  # compute, wait, comm, data, gc, paced: [R, S] (only those recorded)
    work: np.ndarray | None  # [R, S] own work (step minus blocked-on-collective time)
    lateness: np.ndarray | None  # [R, S] ns the rank arrived after its group's median rank (max per step)
    arrival_basis: str  # "aligned clocks" | "collective durations" | "none"
    instances: pl.DataFrame | None  # one row per collective instance
    rows: pl.DataFrame | None  # collective rows with wait/transfer (arrival instances only)
    clock_uncertainty_ns: float | None
    samples_per_step: np.ndarray | None  # [S] global samples per step
    rank_info: pl.DataFrame
    stage_of_rank: np.ndarray | None  # [R] pipeline stage, when known
    notes: list[str] = field(default_factory=list)

    @property
    def n_ranks(self) -> int:
        return int(self.ranks.size)

    @property
    def n_steps(self) -> int:
        return int(self.steps.size)

    @property
    def mean_step_ns(self) -> float:
        return float(np.nanmean(self.step_time)) if self.step_time.size else float("nan")


def _index(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
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


def _dense(frame: pl.DataFrame, value: str, ranks: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Scatter a (rank, step, value) frame into a [R, S] float matrix (NaN where absent)."""
    out = np.full((ranks.size, steps.size), np.nan)
    if frame.height == 0:
        return out
    ri = _index(frame["rank"].to_numpy().astype(np.int64), ranks)
    si = _index(frame["step"].to_numpy().astype(np.int64), steps)
    ok = (ri >= 0) & (si >= 0)
    out[ri[ok], si[ok]] = frame[value].cast(pl.Float64).to_numpy()[ok]
    return out


def _dense_reduce(
    frame: pl.DataFrame, value: str, ranks: np.ndarray, steps: np.ndarray, op: np.ufunc
) -> np.ndarray:
    """Like ``_dense`` but combining several rows per (rank, step) with ``op`` (np.maximum, np.add),
    unbuffered in place — far cheaper than a 2-million-group group-by."""
    ri = _index(frame["rank"].to_numpy().astype(np.int64), ranks)
    si = _index(frame["step"].to_numpy().astype(np.int64), steps)
    ok = (ri >= 0) & (si >= 0)
    flat = ri[ok] * steps.size + si[ok]
    vals = frame[value].cast(pl.Float64).to_numpy()[ok]
    fill = -np.inf if op is np.maximum else 0.0
    out = np.full(ranks.size * steps.size, fill)
    op.at(out, flat, vals)
    seen = np.zeros(out.size, dtype=bool)
    seen[flat] = True
    out[~seen] = np.nan
    return out.reshape(ranks.size, steps.size)


def _clock_uncertainty(rank_info: pl.DataFrame) -> float | None:
    """Worst relative clock error between two ranks (sum of the two largest), 0 on a single host."""
    hosts = rank_info["host"].drop_nulls().unique() if "host" in rank_info.columns else pl.Series([])
    nodes = rank_info["node"].drop_nulls().unique() if "node" in rank_info.columns else pl.Series([])
    single_host = (hosts.len() == 1 and rank_info["host"].null_count() == 0) or (
        hosts.len() == 0 and nodes.len() == 1 and rank_info["node"].null_count() == 0
    )
    errs = rank_info["clock_err_ns"] if "clock_err_ns" in rank_info.columns else pl.Series([], dtype=pl.Int64)
    if errs.len() and errs.null_count() == 0:
        top = np.sort(errs.cast(pl.Float64).to_numpy())[::-1]
        return float(top[0] + (top[1] if top.size > 1 else 0.0))
    return 0.0 if single_host else None


def _warmup(n_steps: int, cfg: DiagnoseConfig) -> int:
    if cfg.warmup_steps is not None:
        return max(0, cfg.warmup_steps)
    return min(20, max(1, n_steps // 10))


def _arrivals(
    coll: pl.DataFrame, basis: str, ranks: np.ndarray, steps: np.ndarray
) -> tuple[pl.DataFrame, pl.DataFrame, np.ndarray]:
    """Instances, per-row waits and the [R, S] lateness matrix from the collectives table.

    Only the aggregations the arrival basis needs are computed (4 M rows at 1,024 ranks × 2,000
    steps × 2 buckets); the op name is matched once per instance, not once per row.
    """
    keys = ["group", "seq"]
    aligned = basis == "aligned clocks"
    c = coll.with_columns(pl.col("group").fill_null("world"))
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
    ]
    if aligned:
        per_basis = [
            pl.col("t_enter_ns").max().alias("last_enter"),
            pl.col("t_enter_ns").median().alias("median_enter"),
            pl.col("t_enter_ns").top_k(2).min().alias("second_enter"),
            pl.col("rank").get(pl.col("t_enter_ns").arg_max()).alias("last_rank"),
        ]
    else:
        per_basis = [
            pl.col("inside_ns").min().alias("min_inside"),
            pl.col("inside_ns").median().alias("median_inside"),
            pl.col("inside_ns").bottom_k(2).max().alias("second_inside"),
            pl.col("rank").get(pl.col("inside_ns").arg_min()).alias("last_rank"),
        ]
    inst = c.group_by(keys).agg(*common, *per_basis)
    inst = inst.with_columns(pl.col("op").cast(pl.String).fill_null("").str.contains(_P2P).alias("p2p"))
    if aligned:
        # A group's collectives run one after another (one stream / one gloo queue): an instance's
        # network time starts when all ranks arrived *and* the previous instance of the group finished,
        # so queueing behind earlier buckets is not counted as this bucket's transfer.
        inst = inst.sort(keys).with_columns(pl.col("min_exit").shift(1).over("group").alias("prev_exit"))
        inst = inst.with_columns(
            (pl.col("min_exit") - pl.max_horizontal("last_enter", pl.col("prev_exit").fill_null(0)))
            .clip(lower_bound=0)
            .alias("transfer_ns"),
            (pl.col("last_enter") - pl.col("median_enter")).alias("skew_ns"),
            (pl.col("last_enter") - pl.col("second_enter")).alias("margin_ns"),
        ).drop("prev_exit")
        back = ["last_enter", "median_enter"]
    else:
        inst = inst.with_columns(
            pl.col("min_inside").alias("transfer_ns"),
            (pl.col("median_inside") - pl.col("min_inside")).alias("skew_ns"),
            (pl.col("second_inside") - pl.col("min_inside")).alias("margin_ns"),
        )
        back = ["min_inside", "median_inside"]
    arrival_inst = inst.filter((pl.col("n") >= 2) & ~pl.col("p2p")).select([*keys, *back])
    arr = c.join(arrival_inst, on=keys, how="inner")
    if aligned:
        arr = arr.with_columns(
            (pl.col("last_enter") - pl.col("t_enter_ns")).alias("wait_ns"),
            (pl.col("t_enter_ns") - pl.col("median_enter")).alias("late_ns"),
        )
    else:
        arr = arr.with_columns(
            (pl.col("inside_ns") - pl.col("min_inside")).alias("wait_ns"),
            (pl.col("median_inside") - pl.col("inside_ns")).alias("late_ns"),
        )
    late = _dense_reduce(arr, "late_ns", ranks, steps, np.maximum)
    return inst, arr.select("rank", "step", "group", "seq", "op", "bytes", "wait_ns", "late_ns"), late


def build_metrics(run: RunData, cfg: DiagnoseConfig) -> RunMetrics:
    """Dense matrices and instance tables of one run (no judgement here)."""
    steps_df = run.steps.filter(pl.col("t_start_ns").is_not_null() & pl.col("t_end_ns").is_not_null())
    notes: list[str] = []
    all_ranks = np.unique(
        np.concatenate(
            [
                steps_df["rank"].to_numpy().astype(np.int64),
                run.collectives["rank"].drop_nulls().to_numpy().astype(np.int64),
            ]
        )
    )
    step_ids = np.unique(steps_df["step"].to_numpy().astype(np.int64))
    warm = _warmup(step_ids.size, cfg)
    step_ids = step_ids[warm:]
    dur = _dense(
        steps_df.with_columns((pl.col("t_end_ns") - pl.col("t_start_ns")).alias("d")),
        "d",
        all_ranks,
        step_ids,
    )
    if all_ranks.size:
        covered = np.mean(~np.isnan(dur), axis=0) >= cfg.min_rank_coverage
        if not covered.all():
            notes.append(
                f"{int((~covered).sum())} steps dropped: fewer than "
                f"{cfg.min_rank_coverage:.0%} of ranks recorded them"
            )
        step_ids = step_ids[covered]
        dur = dur[:, covered]
    with np.errstate(all="ignore"):
        step_time = nanmedian(dur, axis=0) if dur.size else np.zeros(0)

    # One (rank, step) -> cell index for every column of the steps table.
    ri = _index(steps_df["rank"].to_numpy().astype(np.int64), all_ranks)
    si = _index(steps_df["step"].to_numpy().astype(np.int64), step_ids)
    cell = (ri >= 0) & (si >= 0)
    ri, si = ri[cell], si[cell]

    def grid(col: str) -> np.ndarray:
        out = np.full((all_ranks.size, step_ids.size), np.nan)
        out[ri, si] = steps_df[col].cast(pl.Float64).to_numpy()[cell]
        return out

    comps: dict[str, np.ndarray] = {}
    for name in ("compute", "wait", "comm", "data", "gc", "paced"):
        col = f"{name}_ns"
        if col in steps_df.columns and steps_df[col].null_count() < steps_df.height:
            comps[name] = grid(col)

    info = run.ranks
    unc = _clock_uncertainty(info) if info.height else (0.0 if all_ranks.size <= 1 else None)
    coll = run.collectives.filter(
        pl.col("t_enter_ns").is_not_null() & pl.col("t_exit_ns").is_not_null() & pl.col("step").is_not_null()
    )
    inst = rows = late = None
    basis = "none"
    if coll.height and all_ranks.size >= 2:
        basis = "aligned clocks" if unc is not None else "collective durations"
        if unc is None:
            notes.append(
                "clock offsets between hosts unknown (no clock_err_ns): arrivals read from each "
                "rank's time inside each collective, which needs no common clock"
            )
        inst, rows, late = _arrivals(coll, basis, all_ranks, step_ids)
        if np.isnan(late).all():
            late = None

    work = None
    if "wait" in comps:
        work = dur - np.nan_to_num(comps["wait"])
    elif late is not None and rows is not None:
        work = dur - np.nan_to_num(_dense_reduce(rows, "wait_ns", all_ranks, step_ids, np.add))

    samples = None
    if "samples" in steps_df.columns and steps_df["samples"].null_count() < steps_df.height:
        samples = np.nansum(grid("samples"), axis=0)

    stage = None
    if info.height and "pp_stage" in info.columns and info["pp_stage"].drop_nulls().n_unique() >= 2:
        m = info.select("rank", "pp_stage").drop_nulls().unique(subset=["rank"])
        stage = np.full(all_ranks.size, -1, dtype=np.int64)
        idx = np.searchsorted(all_ranks, m["rank"].to_numpy())
        ok = idx < all_ranks.size
        stage[idx[ok]] = m["pp_stage"].to_numpy()[ok]
    return RunMetrics(
        run=run,
        path=str(run.path),
        ranks=all_ranks,
        steps=step_ids,
        warmup=warm,
        step_time=step_time,
        duration=dur,
        components=comps,
        work=work,
        lateness=late,
        arrival_basis=basis,
        instances=inst,
        rows=rows,
        clock_uncertainty_ns=unc,
        samples_per_step=samples,
        rank_info=info,
        stage_of_rank=stage,
        notes=notes,
    )
