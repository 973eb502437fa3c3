"""Per-run metrics the detectors share: dense rank × step matrices and per-collective-instance timing.

For one collective instance (``group``, ``seq``): ``last = max_r t_enter``, each rank's wait
``last − t_enter_r``, the transfer ``min_r t_exit − last`` and the last arriver (DESIGN.md). When the
ranks' clocks are not known to be aligned (several hosts and no ``clock_err_ns``), arrivals are read
from each rank's own time inside the collective instead — ``t_exit − t_enter`` is a duration on one
clock, and every rank leaves a collective at about the same moment, so the rank with the shortest stay
arrived last. That basis is immune to clock offsets, at the price of the (small) spread of exit times.

Everything is vectorized: polars group-bys over instances, numpy over dense [rank, step] matrices.
The collectives table is streamed (``arrivals``): no per-row frame of the whole run is ever built.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from fabricpace.diagnose.arrivals import Arrivals, arrivals, inconsistent_groups, index_of
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.stats import nanmedian, prose_list
from fabricpace.run.reader import RunData, StepChunks


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
    members: pl.DataFrame | None  # (group, rank) pairs seen in the collectives
    clock_uncertainty_ns: float | None
    samples_per_step: np.ndarray | None  # [S] global samples per step
    rank_info: pl.DataFrame
    stage_of_rank: np.ndarray | None  # [R] pipeline stage, when known
    notes: list[str] = field(default_factory=list)
    samples: np.ndarray | None = None  # [R, S] samples per rank and step (None when not recorded)
    # Rows (indices into ``ranks``) of the ranks that synchronize with each other through recorded
    # collectives: one set when every rank is linked to every other (one job-wide group, or TP × DP
    # groups that overlap); several when the recorded groups split the ranks (DP subgroups {0,2} and
    # {1,3} with no job-wide collective recorded). Lateness is judged within a set.
    sync_sets: list[np.ndarray] = field(default_factory=list)
    # Groups left out because their rows are not one collective per (group, seq)
    # (``arrivals.inconsistent_groups``): group, instances, early_exits, max_gap_ms.
    dropped_groups: list[dict[str, Any]] = field(default_factory=list)
    # What the detectors compute once per run and reuse (replay.queue_bound's pass over the rows).
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def n_ranks(self) -> int:
        return int(self.ranks.size)

    @property
    def n_steps(self) -> int:
        return int(self.steps.size)

    @property
    def mean_step_ns(self) -> float:
        return float(np.nanmean(self.step_time)) if self.step_time.size else float("nan")

    @property
    def step_wait(self) -> np.ndarray | None:
        """[R, S] time each rank was blocked on collectives in each step: the steps table's ``wait_ns``,
        else (imported traces) step minus own work; None when neither is known."""
        if "wait" in self.components:
            return self.components["wait"]
        return self.duration - self.work if self.work is not None else None

    @property
    def sets(self) -> list[np.ndarray]:
        """``sync_sets``, or all ranks as one set."""
        return self.sync_sets or [np.arange(self.n_ranks)]

    def dropped_reason(self) -> str | None:
        """Why collectives were left out (``dropped_groups``), in words; None when none were."""
        if not self.dropped_groups:
            return None
        d = self.dropped_groups
        early = sum(int(g["early_exits"]) for g in d)
        total = sum(int(g["instances"]) for g in d)
        gap = max(float(g["max_gap_ms"]) for g in d)
        names = prose_list([f"'{g['group']}'" for g in d])
        return (
            f"collectives of {'group' if len(d) == 1 else 'groups'} {names} left out: in {early} of "
            f"{total} all-reduce/all-gather/barrier instances a rank left before another entered (by up "
            f"to {gap:.1f} ms), which one collective cannot do — rows of different process groups share "
            "one name (fabricpace's collective wrapper once recorded a group passed positionally as "
            "'world') or exits were stamped before completion, so their arrivals and transfers cannot be read"
        )


_index = index_of  # kept for the detectors that import it from here


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


# Exits before the last entry are judged beyond the clock uncertainty plus this: stamps taken around
# the call on one clock cannot show it at all, so any real case is far above (932 ms in the audit).
_EXIT_SLACK_NS = 100_000


def _warmup(steps: np.ndarray, cfg: DiagnoseConfig, run_span: tuple[int, int] | None) -> int:
    """Leading entries of ``steps`` (sorted step ids) that are warm-up. With ``cfg.steps`` the warm-up is
    the run's first steps (``run_span``: its first and last step), so a window later in the run has none."""
    if cfg.warmup_steps is not None:
        return max(0, cfg.warmup_steps)
    if cfg.steps is None or run_span is None:
        return min(20, max(1, steps.size // 10))
    first, last = run_span
    warm = min(20, max(1, (last - first + 1) // 10))
    return int(np.count_nonzero(steps < first + warm))


def build_metrics(
    run: RunData,
    cfg: DiagnoseConfig,
    *,
    collectives: StepChunks | None = None,
    progress: Callable[[int, int], None] | None = None,
    run_span: tuple[int, int] | None = None,
) -> RunMetrics:
    """Dense matrices and instance tables of one run (no judgement here).

    ``collectives``: read that table chunk by chunk (``cfg.chunk_rows`` rows at a time) instead of
    ``run.collectives``; ``progress(done, total)`` after each chunk. ``run_span``: the whole run's first
    and last step, when ``run`` holds only the window ``cfg.steps`` (its warm-up is the run's)."""
    steps_df = run.steps.filter(pl.col("t_start_ns").is_not_null() & pl.col("t_end_ns").is_not_null())
    notes: list[str] = []
    info = run.ranks
    step_ranks = np.unique(steps_df["rank"].to_numpy().astype(np.int64))
    unc = _clock_uncertainty(info) if info.height else None
    all_steps = np.unique(steps_df["step"].to_numpy().astype(np.int64))
    arr = None
    # A rank's wait per step comes from the steps table when it has one (the observer, the simulator);
    # only without it (imported traces) is it rebuilt from the collectives, which costs a sort.
    has_wait = "wait_ns" in steps_df.columns and steps_df["wait_ns"].null_count() < steps_df.height
    dropped: list[dict[str, Any]] = []
    if collectives is not None or run.collectives.height:
        source = collectives if collectives is not None else run.collectives

        def read(skip: Collection[str] = ()) -> Arrivals:
            return arrivals(
                source,
                aligned=unc is not None,
                ranks=step_ranks,
                steps=all_steps,
                rows_per_chunk=cfg.chunk_rows,
                progress=progress,
                waits=not has_wait,
                skip_groups=skip,
            )

        arr = read()
        if unc is not None and arr.instances is not None:
            # Rows under one (group, seq) that cannot be one collective: read again without those groups
            # (rare, so the second pass costs nothing on a sound run).
            bad = inconsistent_groups(arr.instances, unc + _EXIT_SLACK_NS)
            if bad.height:
                found = bad.select("group", "instances", "early_exits", "max_gap_ns")
                dropped = [
                    {"group": str(g), "instances": int(n), "early_exits": int(e), "max_gap_ms": x / 1e6}
                    for g, n, e, x in found.iter_rows()
                ]
                arr = read([d["group"] for d in dropped])
    all_ranks = arr.ranks if arr is not None else step_ranks
    if not info.height:
        unc = 0.0 if all_ranks.size <= 1 else None
    warm = _warmup(all_steps, cfg, run_span)
    step_ids = all_steps[warm:]
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

    inst = late = wait = members = None
    sets: list[np.ndarray] = []
    basis = "none"
    if arr is not None and arr.rows and all_ranks.size >= 2:
        basis = "aligned clocks" if unc is not None else "collective durations"
        if unc is None:
            notes.append(
                "clock offsets between hosts unknown (no clock_err_ns): arrivals read from each "
                "rank's time inside each collective, which needs no common clock"
            )
        inst, members = arr.instances, arr.members
        sets = _sync_sets(all_ranks, inst, members)
        cols = index_of(step_ids, all_steps)
        assert arr.late is not None
        late = arr.late[:, cols]
        wait = arr.wait[:, cols] if arr.wait is not None else None
        if np.isnan(late).all():
            late = None

    work = None
    if "wait" in comps:
        work = dur - np.nan_to_num(comps["wait"])
    elif late is not None and wait is not None:
        work = dur - np.nan_to_num(wait)

    samples = rank_samples = None
    if "samples" in steps_df.columns and steps_df["samples"].null_count() < steps_df.height:
        rank_samples = grid("samples")
        samples = np.nansum(rank_samples, axis=0)

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
        members=members,
        clock_uncertainty_ns=unc,
        samples_per_step=samples,
        rank_info=info,
        stage_of_rank=stage,
        notes=notes,
        samples=rank_samples,
        sync_sets=sets,
        dropped_groups=dropped,
    )


def _sync_sets(
    ranks: np.ndarray, inst: pl.DataFrame | None, members: pl.DataFrame | None
) -> list[np.ndarray]:
    """Connected components of "shares an arrival collective with" over the ranks (rows into ``ranks``):
    [] (one set of all ranks) unless the recorded groups split the ranks into two or more sets of two
    or more. Label propagation over the (group, rank) pairs: each pass gives every member the smallest
    label in its groups, until nothing changes (passes ≤ the graph's diameter, vectorized)."""
    if inst is None or members is None or ranks.size < 4:
        return []
    arrival = inst.filter((pl.col("n") >= 2) & ~pl.col("p2p"))["group"].unique()
    pairs = members.filter(pl.col("group").is_in(arrival.to_list()))
    if pairs.height == 0:
        return []
    _, gid = np.unique(pairs["group"].cast(pl.String).to_numpy().astype(str), return_inverse=True)
    row = index_of(pairs["rank"].to_numpy().astype(np.int64), ranks)
    ok = row >= 0
    gid, row = gid[ok], row[ok]
    label = np.arange(ranks.size)
    while True:
        low = np.full(int(gid.max()) + 1 if gid.size else 0, ranks.size)
        np.minimum.at(low, gid, label[row])
        new = label.copy()
        np.minimum.at(new, row, low[gid])
        if np.array_equal(new, label):
            break
        label = new
    linked = np.zeros(ranks.size, dtype=bool)
    linked[row] = True
    sets = [np.flatnonzero(label == v) for v in np.unique(label[linked])]
    if sum(s.size >= 2 for s in sets) < 2:
        return []
    return sets + [np.array([i]) for i in np.flatnonzero(~linked)]
