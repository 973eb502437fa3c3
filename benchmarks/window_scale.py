"""Benchmark: what one window costs every rank as the job grows (256 to 16,384 ranks).

Every W steps each rank turns the gathered (ranks × fields) matrix into summaries
(``fabricpace.observe.windows.cross_rank``) and runs the pacing controller on them
(``Controller.update``), in the training thread, at the same step on every rank — so the job pays the
slowest rank's time once per window; rank 0 also computes the status line's fleet view
(``observe.status.window_stats``). This times both on synthetic windows (a 2% compute spread, one
30%-slow rank, DDP buckets in every arrival slot), median over the windows of one run per size.

    .venv/bin/python benchmarks/window_scale.py [--worlds 256,2048,16384] [--windows 12]

Read the result against the window's length: 50 steps of 0.5 s is 25 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from fabricpace.observe import windows
from fabricpace.observe.status import window_stats
from fabricpace.pacing.controller import Controller
from fabricpace.run.window import WINDOW_FIELDS

NF = len(WINDOW_FIELDS)
F = {name: i for i, name in enumerate(WINDOW_FIELDS)}


def gathered(world: int, window: int, slots: int, rng: np.random.Generator) -> np.ndarray:
    """One window's gathered matrix as the observer's all-gather delivers it."""
    m = np.zeros((world, NF + 4 * slots))
    compute = 80e6 * (1 + 0.02 * rng.standard_normal(world))
    compute[5] *= 1.3
    step = compute.max() + 20e6
    m[:, F["rank"]] = np.arange(world)
    m[:, F["window"]] = window
    m[:, F["first_step"]] = window * 50
    m[:, F["steps"]] = 50
    m[:, F["step_mean_ns"]] = m[:, F["step_median_ns"]] = step
    m[:, F["step_std_ns"]] = 2e6
    m[:, F["compute_median_ns"]] = compute
    m[:, F["compute_per_sample_ns"]] = compute / 12
    m[:, F["wait_mean_ns"]] = step - compute
    m[:, F["comm_mean_ns"]] = 20e6
    m[:, F["collectives"]] = 50 * 8
    m[:, F["samples_mean"]] = 12
    m[:, F["rss_bytes"]] = 1e9
    blocks = m[:, NF:].reshape(world, 4, slots)
    blocks[:, 0, :] = windows.group_id("ddp:world")
    blocks[:, 1, :] = np.arange(slots)
    enter = np.arange(slots)[None, :] * 1e6 + (compute / compute.max())[:, None] * 5e5
    blocks[:, 2, :] = enter
    blocks[:, 3, :] = enter.max(axis=0) + 2e5
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="256,2048,16384")
    ap.add_argument("--windows", type=int, default=12)
    ap.add_argument("--slots", type=int, default=128, help="ObserverConfig.arrival_slots")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.windows} windows per size; "
          "median (max) ms per window")
    print(f"{'ranks':>6} {'cross_rank':>16} {'Controller.update':>18} {'both':>14} {'rank 0 status':>15}")
    for world in (int(w) for w in args.worlds.split(",")):
        ctl = Controller(world, policies="auto")
        t_cross, t_ctl, t_stat = [], [], []
        for w in range(args.windows):
            m = gathered(world, w, args.slots, rng)
            t0 = time.perf_counter()
            summaries = windows.cross_rank(m, args.slots)
            t1 = time.perf_counter()
            ctl.update(w * 50 + 50, summaries)
            t2 = time.perf_counter()
            window_stats(summaries)
            t3 = time.perf_counter()
            t_cross.append((t1 - t0) * 1e3)
            t_ctl.append((t2 - t1) * 1e3)
            t_stat.append((t3 - t2) * 1e3)
        both = [a + b for a, b in zip(t_cross, t_ctl, strict=True)]
        print(f"{world:>6} {statistics.median(t_cross):>8.1f} ({max(t_cross):>5.1f}) "
              f"{statistics.median(t_ctl):>10.1f} ({max(t_ctl):>5.1f}) "
              f"{statistics.median(both):>6.1f} ({max(both):>5.1f}) "
              f"{statistics.median(t_stat):>7.1f} ({max(t_stat):>5.1f})")


if __name__ == "__main__":
    main()
