"""Window summaries: what each rank contributes every W steps, and how the gathered matrix is read.

Each rank sends one float64 vector of fixed length ``len(WINDOW_FIELDS) + 4 * S`` (S =
``arrival_slots``): its own ``WindowSummary`` followed by an *arrival block* — group id, sequence
number, aligned arrival (t_enter) and aligned completion (t_exit) of its last S completed
collectives in the window (padded with seq = −1). One all-gather of a (world × length) tensor per
window is the only collective the observer adds; its size never depends on traffic.

After the gather every rank matches collective instances by (group id, seq) across ranks and fills
the cross-rank fields of every summary identically (so every pacer takes the same decision):

* ``last_arrivals`` — instances in which this rank arrived last, scaled from the S compared
  instances to the window's ``collectives`` (exact when the window had ≤ S collectives);
* ``arrivals_compared`` — instances this rank took part in that were compared;
* ``transfer_mean_ns`` — per step, Σ over instances of (min exit − last arrival), same scaling;
* ``skew_mean_ns`` — per step, Σ over instances of (last arrival − own arrival): waiting for peers.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Any

import numpy as np

from fabricpace.observe.recorder import Colls, RoundsBlock, tail_parts
from fabricpace.run.window import WINDOW_FIELDS, WindowRows, tail_steps

NF = len(WINDOW_FIELDS)
_F = {name: i for i, name in enumerate(WINDOW_FIELDS)}


@functools.lru_cache(maxsize=256)
def group_id(name: str) -> int:
    """A stable (cross-process) 31-bit id for a group name; Python's hash() is salted per process."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def leaf_id(name: str | None) -> float:
    """The window field ``leaf`` for a leaf switch name (-1.0 when unknown): exact in a float64."""
    return float(group_id(name)) if name else -1.0


_STATM: list[Any] = [None, -1]  # [fd, pid]: /proc/self/statm kept open (re-read with pread each window)


def rss_bytes() -> float:
    """Resident memory of this process (Linux /proc; 0 when unknown)."""
    import os

    try:
        if _STATM[1] != os.getpid():  # first call, or a forked child (the fd names the parent)
            _STATM[0] = os.open("/proc/self/statm", os.O_RDONLY)
            _STATM[1] = os.getpid()
        return float(int(os.pread(_STATM[0], 128, 0).split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return 0.0


try:
    import os as _os

    _PAGE = _os.sysconf("SC_PAGE_SIZE")
except (OSError, ValueError, AttributeError):
    _PAGE = 4096

# The low percentiles of compute per step, as np.quantile(..., method="lower") takes them.
_LOW_Q = (("compute_p10_ns", 0.1), ("compute_p20_ns", 0.2), ("compute_p30_ns", 0.3), ("compute_p40_ns", 0.4))

# Column indices of finalized step rows (recorder.STEP_FIELDS).
_STEP, _T0, _T1, _COMPUTE, _WAIT, _COMM, _DATA, _GC, _PACED, _SAMPLES, _GCC = range(11)


def _stats_rows(rows: list[Any]) -> list[float]:
    """The window's own fields from finalized step rows given as tuples (Python only)."""
    vals = [0.0] * NF
    n = len(rows)
    vals[_F["steps"]] = n
    if not n:
        return vals
    cols = list(zip(*rows, strict=True))
    dur = [b - a for a, b in zip(cols[_T0], cols[_T1], strict=True)]
    lo, hi = (n - 1) // 2, n // 2
    med = []
    for values in (dur, cols[_COMPUTE], cols[_SAMPLES]):
        srt = sorted(values)
        med.append((srt[lo] + srt[hi]) * 0.5)
        if values is cols[_COMPUTE]:
            for name, p in _LOW_Q:
                vals[_F[name]] = float(srt[int(p * (n - 1))])
    dur_mean = sum(dur) / n
    vals[_F["first_step"]] = float(rows[0][_STEP])
    vals[_F["step_mean_ns"]] = dur_mean
    vals[_F["step_median_ns"]] = med[0]
    vals[_F["step_std_ns"]] = math.sqrt(sum((d - dur_mean) ** 2 for d in dur) / n)
    vals[_F["compute_median_ns"]] = med[1]
    vals[_F["compute_per_sample_ns"]] = med[1] / med[2] if med[2] > 0 else 0.0
    vals[_F["wait_mean_ns"]] = sum(cols[_WAIT]) / n
    vals[_F["comm_mean_ns"]] = sum(cols[_COMM]) / n
    vals[_F["data_mean_ns"]] = sum(cols[_DATA]) / n
    vals[_F["gc_mean_ns"]] = sum(cols[_GC]) / n
    vals[_F["gc_count"]] = float(sum(cols[_GCC]))
    vals[_F["paced_mean_ns"]] = sum(cols[_PACED]) / n
    vals[_F["samples_mean"]] = sum(cols[_SAMPLES]) / n
    k = tail_steps(n)  # the window's last k steps: is a straggler still slow at its end?
    tail = sorted(cols[_COMPUTE][n - k :])
    vals[_F["tail_compute_median_ns"]] = (tail[(k - 1) // 2] + tail[k // 2]) * 0.5
    vals[_F["tail_samples_mean"]] = sum(cols[_SAMPLES][n - k :]) / k
    return vals


def _stats_array(s: np.ndarray) -> list[float]:
    """The same fields from an (n × 11) float array (general path)."""
    vals = [0.0] * NF
    n = s.shape[0]
    vals[_F["steps"]] = n
    if not n:
        return vals
    dur = s[:, _T1] - s[:, _T0]
    # Three medians from one sort (np.median per column costs ~5x more in Python overhead).
    srt = np.sort(np.stack([dur, s[:, _COMPUTE], s[:, _SAMPLES]]), axis=1)
    lo, hi = srt[:, (n - 1) // 2].tolist(), srt[:, n // 2].tolist()
    med = [(a + b) * 0.5 for a, b in zip(lo, hi, strict=True)]
    for name, p in _LOW_Q:
        vals[_F[name]] = float(srt[1, int(p * (n - 1))])
    sums = s.sum(axis=0).tolist()
    dur_mean = (sums[_T1] - sums[_T0]) / n
    dev = dur - dur_mean
    vals[_F["first_step"]] = float(s[0, _STEP])
    vals[_F["step_mean_ns"]] = dur_mean
    vals[_F["step_median_ns"]] = med[0]
    vals[_F["step_std_ns"]] = math.sqrt(float(np.dot(dev, dev)) / n)
    vals[_F["compute_median_ns"]] = med[1]
    vals[_F["compute_per_sample_ns"]] = med[1] / med[2] if med[2] > 0 else 0.0
    vals[_F["wait_mean_ns"]] = sums[_WAIT] / n
    vals[_F["comm_mean_ns"]] = sums[_COMM] / n
    vals[_F["data_mean_ns"]] = sums[_DATA] / n
    vals[_F["gc_mean_ns"]] = sums[_GC] / n
    vals[_F["gc_count"]] = sums[_GCC]
    vals[_F["paced_mean_ns"]] = sums[_PACED] / n
    vals[_F["samples_mean"]] = sums[_SAMPLES] / n
    k = tail_steps(n)
    vals[_F["tail_compute_median_ns"]] = float(np.median(s[n - k :, _COMPUTE]))
    vals[_F["tail_samples_mean"]] = float(s[n - k :, _SAMPLES].mean())
    return vals


def local_vector(
    *, rank: int, window: int, steps: Any, colls: Any, base_ns: int, slots: int, leaf: float = -1.0,
) -> np.ndarray:
    """This rank's row of the gather: its summary fields and its arrival block (aligned times).

    ``steps``: finalized step rows (n × 11 array, or a list of row tuples); ``colls``: collective
    parts (``recorder.Colls`` / ``RoundsBlock``) or row tuples; ``leaf``: ``leaf_id()`` of this rank's
    leaf switch (-1 unknown). Once per window."""
    vec = np.zeros(NF + 4 * slots, dtype=np.float64)
    block = vec[NF:].reshape(4, slots)
    block[1, :] = -1.0  # seq = -1 marks an empty slot
    if isinstance(colls, (Colls, RoundsBlock)):
        parts: list[Any] = [colls]
    else:
        items = list(colls)
        parts = items if items and isinstance(items[0], (Colls, RoundsBlock)) else [Colls.from_rows(items)]
    # At a window boundary numpy's code is cold after the training step (several µs per call here,
    # measured), so rows that arrive as Python tuples are summarized in Python.
    if isinstance(steps, list):
        vals = _stats_rows(steps)
    else:
        vals = _stats_array(np.asarray(steps, dtype=np.float64).reshape(-1, 11))
    vals[_F["rank"]], vals[_F["window"]] = rank, window
    vals[_F["leaf"]] = leaf
    vals[_F["rss_bytes"]] = rss_bytes()
    total, tail, names = tail_parts(parts, slots)
    vals[_F["collectives"]] = total
    vec[:NF] = vals
    if tail is not None:
        codes, seq, enter, exit_ = tail
        k = seq.size
        gids = np.array([group_id(name) for name in names], dtype=np.float64)
        block[0, :k] = gids[codes]
        block[1, :k] = seq
        block[2, :k] = enter - base_ns
        block[3, :k] = exit_ - base_ns
    return vec


def cross_rank(matrix: np.ndarray, slots: int) -> WindowRows:
    """Summaries of all ranks from the gathered (world × length) matrix, cross-rank fields filled."""
    world = matrix.shape[0]
    head = matrix[:, :NF].copy()
    blocks = matrix[:, NF:].reshape(world, 4, slots)
    gid, seq, enter, exit_ = (blocks[:, i, :] for i in range(4))
    valid = seq >= 0
    last: np.ndarray = np.zeros(world)
    compared: np.ndarray = np.zeros(world)
    transfer: np.ndarray = np.zeros(world)
    skew: np.ndarray = np.zeros(world)
    if world >= 2 and valid[0].any() and (gid == gid[0]).all() and (seq == seq[0]).all():
        # The usual case: every rank shipped the same instances in the same slots (lock-step DDP
        # buckets), so slot j is one instance everywhere — column reductions, no matching needed.
        cols = valid[0]
        ent, ext = enter[:, cols], exit_[:, cols]
        max_enter = ent.max(axis=0)
        last = np.bincount(ent.argmax(axis=0), minlength=world).astype(np.float64)  # lowest rank on ties
        compared = np.full(world, float(cols.sum()))
        transfer = np.full(world, float(np.maximum(0.0, ext.min(axis=0) - max_enter).sum()))
        skew = (max_enter - ent).sum(axis=1)
    elif valid.any():
        ranks = np.broadcast_to(np.arange(world)[:, None], seq.shape)[valid]
        key = gid[valid].astype(np.int64) * (1 << 32) + seq[valid].astype(np.int64)
        ent, ext = enter[valid], exit_[valid]
        uniq, inv = np.unique(key, return_inverse=True)
        count = np.bincount(inv, minlength=uniq.size)
        max_enter = np.full(uniq.size, -np.inf)
        np.maximum.at(max_enter, inv, ent)
        min_exit = np.full(uniq.size, np.inf)
        np.minimum.at(min_exit, inv, ext)
        shared = count[inv] >= 2  # an instance seen by one rank only says nothing about arrival order
        # Last arriver: the lowest rank whose arrival equals the instance's maximum (ties are rare).
        is_max = (ent == max_enter[inv]) & shared
        first_max = np.full(uniq.size, world, dtype=np.int64)
        np.minimum.at(first_max, inv[is_max], ranks[is_max])
        winners = first_max[first_max < world]
        last = np.bincount(winners, minlength=world).astype(np.float64)
        compared = np.bincount(ranks[shared], minlength=world).astype(np.float64)
        xfer = np.maximum(0.0, min_exit[inv] - max_enter[inv])
        transfer = np.bincount(ranks[shared], weights=xfer[shared], minlength=world)
        skew = np.bincount(ranks[shared], weights=(max_enter[inv] - ent)[shared], minlength=world)
    total = head[:, _F["collectives"]]
    scale = np.divide(total, compared, out=np.zeros(world), where=compared > 0)
    steps = np.maximum(head[:, _F["steps"]], 1.0)
    head[:, _F["last_arrivals"]] = last * scale
    head[:, _F["transfer_mean_ns"]] = transfer * scale / steps
    head[:, _F["arrivals_compared"]] = compared
    head[:, _F["skew_mean_ns"]] = skew * scale / steps
    # (the matrix travels with the summaries: the pacing controller reads it instead of the objects)
    return WindowRows.from_matrix(head)
