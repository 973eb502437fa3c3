"""The straggler what-if bounded by each group's transfer queue.

``stats.whatif_saving`` shortens a step by the culprits' lateness. That holds when the transfers are
hidden behind compute; when they are not, the slow rank's late arrivals were *pacing* a queue that is
busy anyway, and without it the fast ranks wait on the transfers instead. The planner audit's
simulated DDP job (dgx-h100-ib, 16 nodes, 320 buckets whose transfers take longer than the backward)
with node 5's compute 1.2× read "what-if saving 10.1%" (12.9 ms/step of lateness) where the same seed
without the slow node is 3.9% faster: the slow node's backward was hiding the others' bucket transfers.

Each group's collectives run one after another, so an instance finishes at
``F_k = max(A_k, F_{k−1}) + T_k`` (arrival of its last rank ``A_k``, transfer ``T_k`` as the instances
table gives it: from the later of the last arrival and the previous instance's end). Unrolled, the
step's last instance finishes at ``max_j (A_j + Σ_{k≥j} T_k)``. Replaying that with the culprits'
arrivals taken out (``A'_j`` = the last arrival of the other ranks) gives what the step would really
save; a step saves at most the most any of its groups saves. The replay holds the other ranks'
arrivals where they were, which is right only while they do not wait for the previous instance: a
group-step in which the median rank entered an instance after the previous one had completed (blocking
collectives issued one after another, or a queue that had drained) is not bounded — there the arrivals
would move too (a real gloo run with 2-rank groups and blocking all-reduces read 0.6% instead of its
~35%). Needs aligned clocks (the transfer of a
queued instance is only known on a common timeline) and completions (not DDP's arrival markers).
The last arrival of the non-culprit ranks per instance needs the rows: one more pass over the
collectives table, streamed like the first, made only for a set of culprits whose finding is reported.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from fabricpace.diagnose.arrivals import index_of
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.run.reader import StepChunks

_COLUMNS = ["rank", "step", "group", "seq", "t_enter_ns"]


def _frames(m: RunMetrics, cfg: DiagnoseConfig) -> Iterable[pl.DataFrame]:
    """The collectives rows: in memory when the run holds them, else streamed from its directory."""
    if m.run.collectives.height:
        yield m.run.collectives.select(_COLUMNS)
        return
    try:
        table = StepChunks(
            m.run.path, "collectives", columns=_COLUMNS, categorical=True, coverage=m.run.coverage
        )
        for _lo, _hi, frame in table.chunks(rows_per_chunk=cfg.chunk_rows):
            yield frame
    except (OSError, ValueError):  # no directory behind the run (built in memory): no bound
        return


def _others_last(m: RunMetrics, culprits: list[int], cfg: DiagnoseConfig) -> pl.DataFrame | None:
    """(group, seq, others_last): per instance, the last arrival of the ranks not in ``culprits``."""
    parts = [
        f.lazy()
        .filter(~pl.col("rank").is_in(culprits))
        .group_by("group", "seq")
        .agg(pl.col("t_enter_ns").max().alias("others_last"))
        .with_columns(pl.col("group").cast(pl.String).fill_null("world"))  # per instance, not per row
        .collect()
        for f in _frames(m, cfg)
    ]
    if not parts:
        return None
    # Max is associative: an instance split over two chunks comes out whole.
    return pl.concat(parts).group_by("group", "seq").agg(pl.col("others_last").max())


def queue_bound(m: RunMetrics, rows: np.ndarray, cfg: DiagnoseConfig) -> np.ndarray | None:
    """[S] ns: the most each step can shrink when the culprit ``rows`` arrive like the other ranks,
    replaying each group's transfer queue (module doc); inf where a step cannot be bounded (no
    instance with a completion, or a group whose members are all culprits). None when no step can:
    clocks not aligned, no instances with completions, no rows to read."""
    inst = m.instances
    need = {"n", "p2p", "min_stay", "transfer_ns", "last_enter", "seq", "group", "step"}
    if m.arrival_basis != "aligned clocks" or inst is None or not need <= set(inst.columns) or rows.size == 0:
        return None
    inst = inst.filter(
        (pl.col("n") >= 2) & ~pl.col("p2p") & (pl.col("min_stay") > 0) & pl.col("transfer_ns").is_not_null()
    )
    si = index_of(inst["step"].to_numpy().astype(np.int64), m.steps)
    inst = inst.with_columns(pl.Series("si", si)).filter(pl.col("si") >= 0)
    if inst.height == 0:
        return None
    key = tuple(sorted(int(v) for v in m.ranks[rows]))
    cache = m.cache.setdefault("queue_bound_others", {})
    if key not in cache:
        cache[key] = _others_last(m, list(key), cfg)
    others = cache[key]
    if others is None:
        return None
    t = pl.col("transfer_ns").cast(pl.Float64)
    a = pl.col("last_enter").cast(pl.Float64)
    a_cf = pl.min_horizontal(a, pl.col("others_last").cast(pl.Float64))
    prev_exit = pl.col("min_exit").shift(1).over("group", "si")
    per = (
        inst.select("group", "seq", "si", "last_enter", "median_enter", "min_exit", "transfer_ns")
        .join(others, on=["group", "seq"], how="left")
        .sort("group", "seq")
        .with_columns(
            t.reverse().cum_sum().reverse().over("group", "si").alias("rest"),
            (pl.col("median_enter") >= prev_exit).fill_null(False).alias("after_prev"),
        )
        .group_by("group", "si")
        .agg(
            (a + pl.col("rest")).max().alias("f"),
            (a_cf + pl.col("rest")).max().alias("f_cf"),
            pl.col("others_last").is_null().any().alias("culprits_only"),
            pl.col("after_prev").any().alias("sequential"),
        )
        .with_columns(
            pl.when(pl.col("culprits_only") | pl.col("sequential"))
            .then(float("inf"))
            .otherwise((pl.col("f") - pl.col("f_cf")).clip(lower_bound=0.0))
            .alias("gain")
        )
        .group_by("si")
        .agg(pl.col("gain").max())
    )
    out = np.full(m.n_steps, np.inf)
    out[per["si"].to_numpy()] = per["gain"].to_numpy()
    return out
