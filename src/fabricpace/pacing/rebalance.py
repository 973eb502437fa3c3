"""Rebalance arithmetic: speed-proportional shares, integer batch counts and gradient weights.

The update stays the same because the *global* batch stays the same set of samples and each rank's
loss is weighted by its sample count. With DDP's mean all-reduce (sum / world), a rank holding ``n_r``
of the ``B`` samples multiplies its mean loss by ``n_r * world / B``; the averaged gradient is then
``(1/world) * sum_r (n_r * world / B) * mean_r = (1/B) * sum_i grad_i``, the same as an equal split.
Only the order of the floating-point sums changes, so parameters agree to rounding: float32 models
match ``torch.allclose(rtol=1e-5, atol=1e-6)`` after tens of SGD steps in our tests (see docs/pacing.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def counts_from_shares(shares: Sequence[float] | None, global_batch: int, world_size: int) -> list[int]:
    """Integer samples per rank summing to ``global_batch`` (largest remainder; at least 1 each).

    Deterministic: ties go to the lower rank, so every rank computes the same counts.
    """
    if global_batch < world_size:
        raise ValueError(f"global batch {global_batch} is smaller than the world size {world_size}")
    if shares is None:
        base, extra = divmod(global_batch, world_size)
        return [base + (1 if r < extra else 0) for r in range(world_size)]
    s = np.asarray(shares, dtype=np.float64)
    if s.size != world_size or not np.all(np.isfinite(s)) or np.any(s < 0) or s.sum() <= 0:
        raise ValueError(f"shares {tuple(shares)} do not describe {world_size} ranks")
    s = s / s.sum()
    spare = global_batch - world_size  # one sample is reserved per rank
    raw = s * global_batch - 1.0
    raw = np.clip(raw, 0.0, None)
    raw = raw * (spare / raw.sum()) if raw.sum() > 0 else np.full(world_size, spare / world_size)
    floor = np.floor(raw).astype(np.int64)
    left = int(spare - floor.sum())
    order = np.lexsort((np.arange(world_size), -(raw - floor)))  # largest remainder, then lower rank
    floor[order[:left]] += 1
    return [int(v) + 1 for v in floor]


def offsets_from_counts(counts: Sequence[int]) -> list[int]:
    """Start of each rank's slice inside the global batch (contiguous, in rank order)."""
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]


def sample_weight(local_samples: int, global_batch: int, world_size: int) -> float:
    """Factor for a rank's *mean* loss so DDP's averaged gradient equals the global-batch mean."""
    return float(local_samples) * float(world_size) / float(global_batch)


def speed_shares(compute_per_sample: np.ndarray) -> np.ndarray:
    """Shares proportional to speed (1 / compute per sample); equalizes compute at the fixed point."""
    cps = np.asarray(compute_per_sample, dtype=np.float64)
    speed = 1.0 / cps
    return speed / speed.sum()


def damped_shares(current: np.ndarray, target: np.ndarray, *, step: float, min_share: float) -> np.ndarray:
    """Move ``step`` of the way to ``target``; floor each rank at ``min_share`` of an equal share."""
    n = current.size
    new = current + step * (target - current)
    new = np.maximum(new, min_share / n)
    new = new / new.sum()
    # Round so that the state (and its decisions) prints and compares cleanly across ranks.
    return np.round(new, 6)


def fixed_step_cost(
    compute: np.ndarray, samples: np.ndarray, *, min_group: int = 2, max_rel_se: float = 0.05
) -> float:
    """Per-step compute that does not scale with the samples (optimizer, data-loader bookkeeping): the
    intercept of compute against samples across ranks. 0 when it cannot be told.

    Compute per sample is compute / samples only if every step's compute scales with its samples. With
    a fixed part ``f``, a rank given fewer samples looks slower per sample than it is (f / n grows), so
    after a straggler recovers, the rank that gave samples away still looks slow and the shares never
    return. Once ranks run different sample counts, ranks of the same speed at two counts reveal ``f``.
    Only ranks at or above the median count are used: those below gave samples away, and whether they
    are still slow is what is being asked (a whole slow node at its own count would set the line). Among
    them, the slope is the median over rank pairs at different counts (Theil-Sen on each count's median
    compute, a pair of counts weighted by the ranks it pairs, so the cost stays small at 10,000 ranks),
    between counts held by at least ``min_group`` ranks, and ``f`` is the median of
    compute - slope * samples, kept below 80% of their smallest compute.

    The intercept is extrapolated from the counts down to 0 samples, so a slope measured between
    counts that differ by little is mostly noise: ResNet-50 with 256 samples per GPU, after a move, has
    ranks at 259, 260 and 261 samples, and 0.5% of rank-to-rank jitter made the "fixed part" 26 ms of a
    98 ms step — the rank that gave samples away then looked 2x faster per sample than the others and
    was handed 6x an equal share. So ``f`` is used only when its standard error — from the spread of
    compute between ranks at the same count (pooled), through the slope of the chosen pair of counts —
    is at most ``max_rel_se`` of the smallest compute (an error below the 5% excess that rebalance
    never acts on); otherwise it cannot be told (0).
    """
    c = np.asarray(compute, dtype=np.float64)
    n = np.asarray(samples, dtype=np.float64)
    ok = np.isfinite(c) & np.isfinite(n) & (c > 0) & (n > 0)
    c, n = c[ok], np.round(n[ok])
    if c.size == 0:
        return 0.0
    up = n >= float(np.median(n))
    c, n = c[up], n[up]
    counts, size = np.unique(n, return_counts=True)
    common = counts[size >= min_group]
    if common.size < 2:
        return 0.0
    keep = np.isin(n, common)
    cc, nn = c[keep], n[keep]
    med = np.array([np.median(cc[nn == v]) for v in common])
    w = size[size >= min_group].astype(np.float64)
    i, j = np.triu_indices(common.size, k=1)
    slopes = (med[j] - med[i]) / (common[j] - common[i])
    weights = w[i] * w[j]
    order = np.argsort(slopes)
    cum = np.cumsum(weights[order])
    pick = int(order[np.searchsorted(cum, 0.5 * cum[-1])])
    slope = float(slopes[pick])  # weighted median
    if not np.isfinite(slope) or slope <= 0:
        return 0.0
    # Standard error of the intercept: pooled spread of compute around each count's median, the
    # standard error of a median (1.2533 sd / sqrt(k)) at the chosen pair of counts, through the slope.
    group = np.searchsorted(common, nn)
    resid = cc - med[group]
    sd = float(np.sqrt(np.sum(resid**2) / max(resid.size - common.size, 1)))
    k = size[size >= min_group].astype(np.float64)
    se_slope = 1.2533 * sd * float(np.sqrt(1.0 / k[i[pick]] + 1.0 / k[j[pick]])) / float(
        common[j[pick]] - common[i[pick]]
    )
    if se_slope * float(np.median(nn)) > max_rel_se * float(cc.min()):
        return 0.0
    f = float(np.median(cc - slope * nn))
    return float(np.clip(f, 0.0, 0.8 * float(cc.min())))
