"""One window of every rank's summaries, aggregated into the fleet view the pacing controller decides on.

Validation (one summary per rank, one window) and the aggregates — the fleet's step time and its
standard error, per-rank compute per sample (without the fixed per-step part), the window's tail, the
GC time a synchronous step pays — live here so that the controller reads as decisions only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fabricpace.pacing.rebalance import fixed_step_cost
from fabricpace.run.window import WINDOW_FIELDS, WindowRows, WindowSummary, summary_matrix, tail_steps


@dataclass(frozen=True, kw_only=True)
class Fleet:
    """Fleet-level view of one window (arrays are indexed by rank)."""

    window: int
    step_time: float  # mean step time (ns), the lowest over ranks (see fleet_view)
    step_stderr: float  # standard error of that mean (within-window spread / sqrt(steps))
    gc_share: float
    wait_share: float
    transfer: float
    compute: np.ndarray
    cps: np.ndarray  # compute per sample, without the fixed per-step part `fixed`
    samples: np.ndarray
    last_share: np.ndarray
    has_arrivals: bool
    rss: float
    steps: float  # steps in the window
    gc_per_step: float  # automatic collections per rank and step (median over ranks)
    gc_ranks: float  # share of the ranks that collected at least once in the window
    # automatic collections per rank and step, the mean over ranks: what the decision log prints (the
    # median is 0 when most ranks did not collect in a short window, even at a 9.6% cost)
    gc_mean_per_step: float = 0.0
    fixed: float = 0.0  # per-step compute that does not scale with samples (ns; 0 = not known)
    # compute per sample over the window's last steps (as ``cps``), or None when a rank did not send it
    tail_cps: np.ndarray | None = None
    tail_samples: np.ndarray | None = None  # mean samples per step over those steps
    # (ranks x 5) the 10th, 20th, 30th and 40th percentiles of compute per step and its median, or None
    # when a rank did not send them: where a slow rank's fast steps lie (``triggers.group_duty``)
    compute_low: np.ndarray | None = None


def fleet_view(summaries: Sequence[WindowSummary], world_size: int) -> Fleet:
    """Validate one window's summaries (one per rank, same window) and aggregate them."""
    if len(summaries) != world_size:
        raise ValueError(f"expected {world_size} window summaries, got {len(summaries)}")
    a = summary_matrix(summaries)
    ranks = a[:, WINDOW_FIELDS.index("rank")]
    if not np.array_equal(ranks, np.arange(world_size)):
        a = a[np.argsort(ranks, kind="stable")]
        ranks = a[:, WINDOW_FIELDS.index("rank")]
        if not np.array_equal(ranks, np.arange(world_size)):
            raise ValueError("window summaries must hold each rank exactly once")
    windows = np.unique(a[:, WINDOW_FIELDS.index("window")])
    if windows.size != 1:
        raise ValueError(f"window summaries mix windows {sorted(int(w) for w in windows)}")
    col = {name: a[:, i] for i, name in enumerate(WindowSummary.__dataclass_fields__)}
    # Every rank runs the same synchronous steps; a one-off stall at a window boundary (rank 0 writing
    # decisions while the others already started the next step) lands on some ranks only, so the
    # fastest rank's mean is the cleanest estimate of the fleet's step time.
    step = float(np.min(col["step_mean_ns"]))
    steps = max(float(np.median(col["steps"])), 1.0)
    stderr = float(np.median(col["step_std_ns"])) / math.sqrt(steps)
    samples = col["samples_mean"]
    fixed = fixed_step_cost(col["compute_median_ns"], samples)
    with np.errstate(divide="ignore", invalid="ignore"):
        fallback = np.where(samples > 0, col["compute_median_ns"] / samples, np.nan)
        cps = np.where(col["compute_per_sample_ns"] > 0, col["compute_per_sample_ns"], fallback)
        if fixed > 0:  # ranks run different sample counts: per-sample cost without the fixed part
            cps = np.where(samples > 0, (col["compute_median_ns"] - fixed) / samples, cps)
        tail_c, tail_n = col["tail_compute_median_ns"], col["tail_samples_mean"]
        tail_cps = (tail_c - fixed) / tail_n if bool(np.all((tail_c > 0) & (tail_n > 0))) else None
        colls = col["collectives"]
        last = np.where(colls > 0, col["last_arrivals"] / np.maximum(colls, 1.0), 0.0)
    safe = step if step > 0 else float("nan")
    return Fleet(
        window=int(windows[0]),
        step_time=step,
        step_stderr=stderr,
        gc_share=max(float(np.mean(col["gc_mean_ns"])), _amplified_gc_ns(col, steps)) / safe,
        wait_share=float(np.median(col["wait_mean_ns"])) / safe,
        transfer=float(np.median(col["transfer_mean_ns"])),
        compute=col["compute_median_ns"],
        cps=cps,
        samples=samples,
        last_share=last,
        has_arrivals=bool(np.all(colls > 0)),
        rss=float(np.max(col["rss_bytes"])),
        steps=steps,
        gc_per_step=float(np.median(col["gc_count"])) / steps,
        gc_ranks=float(np.mean(col["gc_count"] > 0)),
        gc_mean_per_step=float(np.mean(col["gc_count"])) / steps,
        fixed=fixed,
        tail_cps=tail_cps if tail_cps is not None and bool(np.all(np.isfinite(tail_cps))) else None,
        tail_samples=col["tail_samples_mean"],
        compute_low=_low_percentiles(col),
    )


LOW_PERCENTILES = (0.1, 0.2, 0.3, 0.4, 0.5)  # the columns of ``Fleet.compute_low``


def _low_percentiles(col: dict[str, np.ndarray]) -> np.ndarray | None:
    low = np.stack(
        [col[n] for n in ("compute_p10_ns", "compute_p20_ns", "compute_p30_ns", "compute_p40_ns",
                          "compute_median_ns")],
        axis=1,
    )  # fmt: skip
    return low if bool(np.all(low[:, :4] > 0)) else None


def _amplified_gc_ns(col: dict[str, np.ndarray], steps: float) -> float:
    """Expected GC time per step that a synchronous step pays: any rank's pause delays everyone.

    With ``lam`` collections per step across the fleet and a mean pause ``p`` per collection, a step
    contains at least one pause with probability ``1 - exp(-lam)``; unaligned, that pause is paid by
    the whole fleet (aligned, each rank's own pauses cost only their mean).
    """
    count = float(np.sum(col["gc_count"]))
    if count <= 0:
        return 0.0
    pause = float(np.sum(col["gc_mean_ns"])) * steps / count
    lam = count / steps
    return pause * (1.0 - math.exp(-lam))


def leaves_from_summaries(summaries: Sequence[WindowSummary], world_size: int) -> tuple[int, ...] | None:
    """Leaf of every rank (numbered 0, 1, ... by first appearance in rank order) from the summaries'
    ``leaf`` ids; None unless every rank reported one and there are at least two leaves."""
    a = summary_matrix(summaries)
    ranks, ids = a[:, WINDOW_FIELDS.index("rank")], a[:, WINDOW_FIELDS.index("leaf")]
    order = np.argsort(ranks, kind="stable")
    ranks, ids = ranks[order], ids[order]
    if not np.array_equal(ranks, np.arange(world_size)) or bool(np.any(ids < 0)):
        return None
    uniq, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    if uniq.size < 2:
        return None
    number = np.empty(uniq.size, dtype=np.int64)
    number[np.argsort(first)] = np.arange(uniq.size)  # numbered in order of first appearance
    return tuple(int(v) for v in number[inverse])


def merge_windows(windows: Sequence[Sequence[WindowSummary]]) -> WindowRows:
    """Consecutive windows of every rank's summaries as one window (a list per window, in order).

    The controller splits one window into short re-check windows after a move kept on its probe; their
    union is then judged as the whole window would have been. Per-step means and the medians are
    step-weighted means (a median of medians is not available; over windows of one state it is close),
    counts add up, the standard deviation pools the within- and between-window spread, and the tail is
    the last window's (or, when it is shorter than a tail, the last windows that cover one): what the
    re-checks are for is the latest steps (a re-check window is no longer than a tail, so its whole
    median stands for its steps).
    """
    if not windows:
        raise ValueError("merge_windows: no windows")
    if len(windows) == 1:
        return WindowRows.of(windows[0])
    mats = [summary_matrix(w) for w in windows]
    rank = WINDOW_FIELDS.index("rank")
    a = np.stack([m[np.argsort(m[:, rank], kind="stable")] for m in mats])  # window x rank x field
    col = {name: a[:, :, i] for i, name in enumerate(WINDOW_FIELDS)}
    steps = col["steps"]
    total = steps.sum(axis=0)
    wt = steps / np.maximum(total, 1.0)

    def mean(name: str) -> np.ndarray:
        return (col[name] * wt).sum(axis=0)

    # the tail: the last windows covering the tail of the last one
    back = np.cumsum(steps[::-1], axis=0)[::-1]  # steps from each window to the end
    need = np.array([tail_steps(max(5, int(t))) for t in steps[-1]], dtype=np.float64)
    tw = np.where((back - steps) < need, steps, 0.0)  # windows that start inside the tail
    tw = tw / np.maximum(tw.sum(axis=0), 1.0)
    step_mean = mean("step_mean_ns")
    var = ((col["step_std_ns"] ** 2 + (col["step_mean_ns"] - step_mean) ** 2) * wt).sum(axis=0)
    compute, samples = mean("compute_median_ns"), mean("samples_mean")
    merged = a[-1].copy()  # rank x field: the last window's values (rank, window, leaf, rss, ...)
    set_ = {
        "first_step": col["first_step"][0],
        "steps": total,
        "step_mean_ns": step_mean,
        "step_median_ns": mean("step_median_ns"),
        "step_std_ns": np.sqrt(var),
        "compute_median_ns": compute,
        "compute_per_sample_ns": np.where(samples > 0, compute / np.where(samples > 0, samples, 1.0), 0.0),
        "samples_mean": samples,
        "tail_compute_median_ns": (col["compute_median_ns"] * tw).sum(axis=0),
        "tail_samples_mean": (col["samples_mean"] * tw).sum(axis=0),
    }
    # (the percentiles of compute too: over windows of one state, close to those of their union)
    for n in ("wait_mean_ns", "comm_mean_ns", "transfer_mean_ns", "data_mean_ns", "gc_mean_ns",
              "paced_mean_ns", "skew_mean_ns", "compute_p10_ns", "compute_p20_ns", "compute_p30_ns",
              "compute_p40_ns"):
        set_[n] = mean(n)
    for n in ("last_arrivals", "collectives", "gc_count", "arrivals_compared"):
        set_[n] = col[n].sum(axis=0)
    index = {n: i for i, n in enumerate(WINDOW_FIELDS)}
    for n, v in set_.items():
        merged[:, index[n]] = v
    return WindowRows(merged)
