"""Vectorized interval arithmetic for trace import: unions, coverage and overlap of time intervals."""

from __future__ import annotations

import numpy as np


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted disjoint intervals."""
    if len(start) == 0:
        return start.astype(np.int64), end.astype(np.int64)
    order = np.argsort(start, kind="stable")
    s, e = start[order], np.maximum(end[order], start[order])
    reach = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > reach[:-1]]
    seg = np.cumsum(new) - 1
    m_start = s[new]
    m_end = np.zeros(len(m_start), dtype=e.dtype)
    np.maximum.at(m_end, seg, e)
    return m_start, m_end


def coverage(b_start: np.ndarray, b_end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted intervals B that lies before each time t."""
    if len(b_start) == 0:
        return np.zeros(len(t), dtype=np.int64)
    lengths = b_end - b_start
    before = np.r_[0, np.cumsum(lengths)]
    idx = np.searchsorted(b_start, t, side="right") - 1
    safe = np.clip(idx, 0, None)
    partial = np.clip(np.minimum(t, b_end[safe]) - b_start[safe], 0, None)
    return np.where(idx >= 0, before[safe] + partial, 0)


def overlap_with(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> np.ndarray:
    """For each interval of A, how much of it the disjoint sorted intervals B cover."""
    return coverage(b_start, b_end, a_end) - coverage(b_start, b_end, a_start)


def covered_per_bin(
    start: np.ndarray,
    end: np.ndarray,
    bins: np.ndarray,
    nbins: int,
    *,
    subtract: np.ndarray | None = None,
) -> np.ndarray:
    """Sum of interval lengths (minus ``subtract``) per bin index; intervals with bin < 0 are dropped."""
    out = np.zeros(nbins, dtype=np.int64)
    if len(start) == 0:
        return out
    length = (end - start).astype(np.int64)
    if subtract is not None:
        length = length - subtract.astype(np.int64)
    ok = (bins >= 0) & (bins < nbins)
    np.add.at(out, bins[ok], np.maximum(length[ok], 0))
    return out
