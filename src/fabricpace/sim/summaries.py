"""Window summaries built from the simulator's arrays — the same vectors the observer all-gathers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fabricpace.run.window import WindowSummary, tail_steps
from fabricpace.sim.engine import BlockResult

_NS = 1e9


def window_summaries(blocks: Sequence[BlockResult], *, window_index: int) -> list[WindowSummary]:
    """One ``WindowSummary`` per rank over the steps of ``blocks`` (one window)."""

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(b, name) for b in blocks], axis=0)

    dur = (cat("t_end") - cat("t_start")) * _NS  # [S, R]
    S, R = dur.shape
    compute = cat("compute") * _NS
    samples = cat("samples").astype(float)
    comp_med = np.median(compute, axis=0)
    samp_med = np.median(samples, axis=0)
    per_sample = np.divide(comp_med, samp_med, out=np.zeros(R), where=samp_med > 0)
    last = np.concatenate([b.last.ravel() for b in blocks])
    last_counts = np.bincount(last, minlength=R).astype(float)
    n_coll = float(sum(b.last.size for b in blocks))
    transfer = float(np.mean(cat("transfer"))) * _NS
    cols = {
        "step_mean_ns": dur.mean(axis=0),
        "step_median_ns": np.median(dur, axis=0),
        "step_std_ns": dur.std(axis=0),
        "compute_median_ns": comp_med,
        "compute_per_sample_ns": per_sample,
        "wait_mean_ns": cat("wait").mean(axis=0) * _NS,
        "comm_mean_ns": cat("comm").mean(axis=0) * _NS,
        "data_mean_ns": cat("data").mean(axis=0) * _NS,
        "gc_mean_ns": cat("gc").mean(axis=0) * _NS,
        "gc_count": cat("gc_count").sum(axis=0).astype(float),
        "paced_mean_ns": cat("paced").mean(axis=0) * _NS,
        "samples_mean": samples.mean(axis=0),
        "rss_bytes": blocks[-1].rss_mb * 1024 * 1024,
        # the window's last steps, as the observer computes them (is a straggler still slow at the end?)
        "tail_compute_median_ns": np.median(compute[S - tail_steps(S) :], axis=0),
        "tail_samples_mean": samples[S - tail_steps(S) :].mean(axis=0),
    }
    low = np.quantile(compute, [0.1, 0.2, 0.3, 0.4], axis=0, method="lower")  # [4, R], as the observer
    for i, name in enumerate(("compute_p10_ns", "compute_p20_ns", "compute_p30_ns", "compute_p40_ns")):
        cols[name] = low[i]
    first = int(blocks[0].steps[0])
    return [
        WindowSummary(
            rank=r,
            window=window_index,
            first_step=first,
            steps=S,
            transfer_mean_ns=transfer,
            last_arrivals=float(last_counts[r]),
            collectives=n_coll,
            **{k: float(v[r]) for k, v in cols.items()},
        )
        for r in range(R)
    ]
