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
import zlib
from typing import Any

import numpy as np

from fabricpace.run.window import WINDOW_FIELDS, WindowSummary

NF = len(WINDOW_FIELDS)
_F = {name: i for i, name in enumerate(WINDOW_FIELDS)}


@functools.lru_cache(maxsize=256)
def group_id(name: str) -> int:
    """A stable (cross-process) 31-bit id for a group name; Python's hash() is salted per process."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def rss_bytes() -> float:
    """Resident memory of this process (Linux /proc; 0 when unknown)."""
    try:
        with open("/proc/self/statm") as f:
            import os

            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return 0.0


def local_vector(
    *, rank: int, window: int, steps: list[tuple[Any, ...]], colls: list[tuple[Any, ...]], base_ns: int,
    slots: int,
) -> np.ndarray:
    """This rank's row of the gather: its summary fields and its arrival block (aligned times)."""
    vec = np.zeros(NF + 4 * slots, dtype=np.float64)
    block = vec[NF:].reshape(4, slots)
    block[1, :] = -1.0  # seq = -1 marks an empty slot
    s = np.asarray([r[:11] for r in steps], dtype=np.float64).reshape(-1, 11)
    n = s.shape[0]
    vals: dict[str, float] = dict.fromkeys(WINDOW_FIELDS, 0.0)
    vals.update(rank=rank, window=window, steps=n, rss_bytes=rss_bytes())
    if n:
        dur = s[:, 2] - s[:, 1]
        samples_med = float(np.median(s[:, 9]))
        compute_med = float(np.median(s[:, 3]))
        vals.update(
            first_step=float(s[0, 0]),
            step_mean_ns=float(dur.mean()),
            step_median_ns=float(np.median(dur)),
            step_std_ns=float(dur.std()),
            compute_median_ns=compute_med,
            compute_per_sample_ns=compute_med / samples_med if samples_med > 0 else 0.0,
            wait_mean_ns=float(s[:, 4].mean()),
            comm_mean_ns=float(s[:, 5].mean()),
            data_mean_ns=float(s[:, 6].mean()),
            gc_mean_ns=float(s[:, 7].mean()),
            gc_count=float(s[:, 10].sum()),
            paced_mean_ns=float(s[:, 8].mean()),
            samples_mean=float(s[:, 9].mean()),
        )
    done = [c for c in colls if c[6] is not None]
    vals["collectives"] = float(len(done))
    vec[:NF] = [vals[name] for name in WINDOW_FIELDS]
    tail = done[-slots:]
    if tail:
        k = len(tail)
        block[0, :k] = [group_id(c[2]) for c in tail]
        block[1, :k] = [c[1] for c in tail]
        block[2, :k] = np.asarray([c[5] for c in tail], dtype=np.float64) - base_ns
        block[3, :k] = np.asarray([c[6] for c in tail], dtype=np.float64) - base_ns
    return vec


def cross_rank(matrix: np.ndarray, slots: int) -> list[WindowSummary]:
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
    if valid.any():
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
    return [WindowSummary.from_array(head[r]) for r in range(world)]
