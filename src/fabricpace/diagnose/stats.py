"""Small vectorized statistics the detectors share: leave-one-out medians, what-if, block bootstrap."""

from __future__ import annotations

from typing import Any

import numpy as np

from fabricpace.diagnose.config import DiagnoseConfig


def nanmedian(x: Any, axis: int | None = None) -> Any:
    """NaN-aware median, vectorized. numpy's nanmedian falls back to a per-column Python loop
    (apply_along_axis) as soon as one NaN is present — 100× slower on [1024, 2000] matrices."""
    x = np.asarray(x, dtype=float)
    if axis is None:
        x = x.ravel()
        axis = 0
    nan = np.isnan(x)
    if not nan.any():
        return np.median(x, axis=axis) if x.shape[axis] else np.full(np.delete(x.shape, axis), np.nan)
    srt = np.sort(x, axis=axis)  # NaN sort last
    n = np.sum(~nan, axis=axis, keepdims=True)
    lo = np.clip((n - 1) // 2, 0, None)
    hi = np.clip(n // 2, 0, None)
    with np.errstate(all="ignore"):
        val = 0.5 * (np.take_along_axis(srt, lo, axis=axis) + np.take_along_axis(srt, hi, axis=axis))
    val = np.where(n == 0, np.nan, val)
    out = np.squeeze(val, axis=axis)
    return float(out) if out.ndim == 0 else out


def robust_cv(x: Any) -> float | None:
    """1.4826 × MAD / median of the finite values: the spread of step times that one outlier step cannot
    make (a 45 s stall in 1,980 steps of 10 ms made the CV 30.5; this stays 0.31). None when empty."""
    v = np.asarray(x, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    med = float(np.median(v))
    return float(1.4826 * np.median(np.abs(v - med)) / med) if med > 0 else None


def loo_median(x: np.ndarray) -> np.ndarray:
    """For a [R, S] matrix: per column, the median of the *other* rows (NaN-aware, vectorized).

    Comparing each rank with the others' median (not the fleet median that includes it) keeps a
    straggler visible even with two ranks.
    """
    r, s = x.shape
    out = np.full_like(x, np.nan, dtype=float)
    if r < 2:
        return out
    filled = np.where(np.isnan(x), np.inf, x)
    order = np.argsort(filled, axis=0, kind="stable")
    srt = np.take_along_axis(filled, order, axis=0)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(r)[:, None].repeat(s, axis=1), axis=0)
    n = np.sum(~np.isnan(x), axis=0)  # valid values per column
    cols = np.arange(s)
    # The other valid values number m = n - 1 for a valid row (n for a NaN row, which sits past them).
    valid = ~np.isnan(x)
    m = np.where(valid, n - 1, n)

    def others_at(k: np.ndarray) -> np.ndarray:
        # k-th smallest of the others: skip this row's own slot when it lies at or before k.
        k = np.clip(k, 0, r - 1)
        idx = np.where(valid & (pos <= k), k + 1, k)
        idx = np.clip(idx, 0, r - 1)
        return srt[idx, np.broadcast_to(cols, (r, s))]

    lo = (m - 1) // 2
    hi = m // 2
    val = 0.5 * (others_at(lo) + others_at(hi))
    val[(m < 1) | ~np.isfinite(val)] = np.nan
    out[:] = val
    return out


def whatif_saving(
    excess: np.ndarray,
    replace: np.ndarray,
    step_time: np.ndarray,
    sets: list[np.ndarray] | None = None,
) -> tuple[float, np.ndarray]:
    """Replace the rows in ``replace`` with the per-step median of the other rows; recompute the
    synchronized step (its length follows the slowest rank) and return (saving share, per-step saving ns).

    ``sets``: rows that synchronize with each other (``RunMetrics.sets``). Each set is its own
    synchronized step — a culprit is replaced by its own set's median — and a step saves what its most
    improved set saves (the sets run side by side, not one after another). None: one set of all rows.
    """
    if not replace.any():
        return 0.0, np.zeros(excess.shape[1])
    if sets is not None and len(sets) > 1:
        per_step = np.zeros(excess.shape[1])
        for rows in sets:
            if replace[rows].any():
                _, part = whatif_saving(excess[rows], replace[rows], step_time)
                np.maximum(per_step, part, out=per_step)
    else:
        keep = ~replace
        with np.errstate(all="ignore"):
            fill = np.nanmedian(excess[keep], axis=0) if keep.any() else np.nanmedian(excess, axis=0)
            new = excess.copy()
            new[replace] = fill
            before = np.nanmax(excess, axis=0)
            after = np.nanmax(new, axis=0)
        per_step = np.nan_to_num(np.clip(before - after, 0, None))
    total = float(np.nansum(step_time))
    return (float(per_step.sum()) / total if total > 0 else 0.0), per_step


def cap_by_wait(
    per_step: np.ndarray, wait: np.ndarray | None, step_time: np.ndarray, exclude: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """(per-step saving bounded by what a step can lose, number of steps the bound cut).

    Removing a late rank shortens a step by at most the time the ranks that waited for it were
    blocked in that step (``wait`` [R, S], the rows in ``exclude`` left out), and never by more than
    the step itself. Lateness can exceed both where the waiting fell outside the step — a collective
    issued between steps (a checkpoint barrier) is recorded with the next step's number — or where the
    rows of one instance are not one collective (``arrivals.inconsistent_groups``; an audit's run read
    "severity 1042%" of step time that way). The bound keeps such lateness out of a share of step time."""
    bound = np.asarray(step_time, dtype=float)
    if wait is not None and wait.size:
        w = wait if exclude is None or not exclude.any() else wait[~exclude]
        if w.size:
            with np.errstate(all="ignore"):
                most = np.nanmax(np.where(np.isnan(w), -np.inf, w), axis=0)
            bound = np.fmin(bound, np.where(np.isfinite(most), np.maximum(most, 0.0), np.nan))
    bound = np.where(np.isnan(bound), np.inf, bound)
    cut = per_step > bound
    return np.where(cut, bound, per_step), int(cut.sum())


def block_bootstrap(
    loss: np.ndarray, step_time: np.ndarray, threshold: float, cfg: DiagnoseConfig
) -> tuple[float, tuple[float, float]]:
    """Moving-block bootstrap of the share Σloss/Σstep over steps (blocks keep autocorrelation).

    Returns (share of resamples at or above ``threshold``, 95% CI of the share).
    """
    ok = np.isfinite(loss) & np.isfinite(step_time)
    loss, step_time = loss[ok], step_time[ok]
    n = loss.size
    if n == 0:
        return 0.0, (float("nan"), float("nan"))
    block = max(1, min(cfg.bootstrap_block, n // 3))  # at least three blocks, even on short runs
    nblocks = int(np.ceil(n / block))
    rng = np.random.default_rng(cfg.seed)
    starts = rng.integers(0, n - block + 1, size=(cfg.bootstrap_resamples, nblocks))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(cfg.bootstrap_resamples, -1)[:, :n]
    shares = loss[idx].sum(axis=1) / step_time[idx].sum(axis=1)
    lo, hi = np.percentile(shares, [2.5, 97.5])
    return float(np.mean(shares >= threshold)), (float(lo), float(hi))


def sample_size_confidence(conf: float, n_steps: int, cfg: DiagnoseConfig) -> float:
    """Cap a bootstrap confidence by what the run's length can show. Steps are autocorrelated; the
    bootstrap treats blocks of ``bootstrap_block`` steps as independent, so a run holds
    B = steps / block independent observations. After B of B agree, Laplace's rule of succession gives
    (B + 1) / (B + 2): 9 steps → 0.66, 54 → 0.86, 140 → 0.94, 1,000 → 0.99. Before, a 10-step real
    run got a finding at confidence 0.99 from 9 usable steps, as sure as one from 1,000."""
    b = n_steps / max(cfg.bootstrap_block, 1)
    return float(min(conf, (b + 1.0) / (b + 2.0)))


def binomial_z(count: np.ndarray, n: int, p0: float) -> np.ndarray:
    """z-score of counts against a Binomial(n, p0) (normal approximation)."""
    if n <= 0 or p0 <= 0 or p0 >= 1:
        return np.zeros_like(count, dtype=float)
    return (count - n * p0) / np.sqrt(n * p0 * (1 - p0))


def runs_test_z(flags: np.ndarray) -> float:
    """Wald–Wolfowitz runs test: strongly negative z means the True steps cluster in periods."""
    n1 = int(flags.sum())
    n0 = int(flags.size - n1)
    if n1 == 0 or n0 == 0:
        return 0.0
    runs = 1 + int(np.count_nonzero(flags[1:] != flags[:-1]))
    n = n1 + n0
    mu = 1 + 2 * n1 * n0 / n
    var = 2 * n1 * n0 * (2 * n1 * n0 - n) / (n * n * (n - 1)) if n > 1 else 0.0
    return float((runs - mu) / np.sqrt(var)) if var > 0 else 0.0


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] by numeric integration (c_N of REFERENCES.md)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-8, 8, 4001)
    from math import erf, sqrt

    cdf = 0.5 * (1 + np.vectorize(erf)(x / sqrt(2)))
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    return float(np.trapezoid(x * n * pdf * cdf ** (n - 1), x))


def fmt_ranks(ids: list[int], limit: int = 12) -> str:
    """[0,1,2,3,7] -> '0-3, 7' (compact, for tables)."""
    if not ids:
        return "-"
    ids = sorted(ids)
    parts: list[str] = []
    start = prev = ids[0]
    for v in [*ids[1:], None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    text = ", ".join(parts[:limit])
    return text + (f", … (+{len(parts) - limit})" if len(parts) > limit else "")


_PLURALS = {"leaf": "leaves", "numa": "NUMA domains", "gpu": "GPUs", "nic": "NICs"}
_SINGULAR = {"numa": "NUMA domain", "gpu": "GPU", "nic": "NIC"}


def prose_list(values: list[Any], limit: int = 8) -> str:
    """[3] -> '3'; [3, 5] -> '3 and 5'; [3, 5, 7] -> '3, 5 and 7'; long lists end '… and 4 more'."""
    items = [str(v) for v in values]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def named(noun: str, values: list[Any], limit: int = 8) -> str:
    """'rank 3', 'ranks 3 and 5', 'nodes 1, 2 and 4', 'GPU 0:1' — a noun and its ids, for prose."""
    if len(values) == 1:
        return f"{_SINGULAR.get(noun, noun)} {values[0]}"
    return f"{_PLURALS.get(noun, noun + 's')} {prose_list(values, limit)}"
