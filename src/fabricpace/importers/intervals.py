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


def intersect_intervals(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Intersection of two sets of disjoint sorted intervals, as disjoint sorted intervals.

    Memory grows with the number of overlapping (A, B) pairs, at most len(A) + len(B), never with the
    product: each interval of A is cut by the run of B's intervals that overlap it."""
    if len(a_start) == 0 or len(b_start) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    first = np.searchsorted(b_end, a_start, side="right")  # first B ending after A's start
    stop = np.searchsorted(b_start, a_end, side="left")  # B's starting before A's end
    n = np.maximum(stop - first, 0)
    ai = np.repeat(np.arange(len(a_start)), n)
    bi = np.repeat(first, n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
    s = np.maximum(a_start[ai], b_start[bi])
    e = np.minimum(a_end[ai], b_end[bi])
    keep = e > s
    return s[keep], e[keep]


def covered_in_windows(
    w_start: np.ndarray, w_end: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """For each window [w_start, w_end), how much of it the disjoint sorted intervals cover.

    What a step's component is: the time inside the step, so an interval that runs past the step's
    end (a gloo span ending after ProfilerStep#N, merged with the next step's first span) counts in
    each step only for its part inside that step."""
    return overlap_with(w_start, np.maximum(w_end, w_start), start, end)
