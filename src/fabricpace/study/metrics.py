"""``summarize_run``: the one function that turns any run directory into a study row.

Every backend (sim, local, lab) is measured by this function only, so their numbers compare.

Definitions (steps before ``warmup`` are dropped):

- iteration time of step s = max over ranks of t_end − min over ranks of t_start (the step as the
  job sees it: from the first rank starting it to the last rank finishing it);
- throughput = samples of the counted steps / wall time from the first counted step's start to the
  last counted step's end (gaps between steps count, as they do for a user's clock); samples are
  divided by the workload's model-parallel degree (TP × PP ranks share their samples);
- cv = standard deviation / mean of the iteration times (population std, ddof 0);
- period = wall time / counted steps: the time per step on the job's clock. When ranks are skewed,
  one rank's step starts before another's previous one ended, so iterations overlap and their mean
  exceeds the period (a rank made faster can even lengthen the iteration while the period shrinks);
  what-if comparisons of speed read the period or the throughput.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from fabricpace._errors import RunDirError
from fabricpace.run.reader import RunData


def step_table(run: RunData, warmup: int = 0) -> pl.DataFrame:
    """Per step: start, end, iteration time (s) and samples, for steps >= warmup (sorted by step)."""
    steps = run.steps
    if steps.height == 0:
        raise RunDirError(f"{run.path}: no steps recorded; nothing to summarize")
    return (
        steps.filter(pl.col("step") >= warmup)
        .group_by("step")
        .agg(
            pl.col("t_start_ns").min().alias("start_ns"),
            pl.col("t_end_ns").max().alias("end_ns"),
            pl.col("samples").sum().alias("samples"),
            pl.len().alias("ranks"),
        )
        .sort("step")
        .with_columns(((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("iter_s"))
    )


def summarize_run(run: RunData, warmup: int) -> dict[str, Any]:
    """Throughput (samples/s), CV of iteration time and friends for one run directory."""
    if warmup < 0:
        raise RunDirError(f"warmup {warmup}: must be >= 0")
    table = step_table(run, warmup)
    if table.height < 2:
        total = run.steps["step"].n_unique()
        raise RunDirError(
            f"{run.path}: {table.height} step(s) after warm-up {warmup} (run has {total}); "
            "run more steps or lower the warm-up"
        )
    it = table["iter_s"].to_numpy()
    mp = int((run.manifest.workload or {}).get("model_parallel", 1) or 1)
    samples = float(table["samples"].sum()) / mp
    wall = (int(table["end_ns"].to_numpy().max()) - int(table["start_ns"].to_numpy().min())) / 1e9
    mean = float(it.mean())
    # Incomplete steps (some rank missing) are reported, not silently mixed in.
    world = run.world_size
    partial = int((table["ranks"] < world).sum())
    return {
        "throughput": samples / wall if wall > 0 else float("nan"),
        "cv": float(it.std() / mean) if mean > 0 else float("nan"),
        "iter_mean_s": mean,
        "iter_p50_s": float(np.median(it)),
        "iter_p99_s": float(np.quantile(it, 0.99)),
        "period_s": wall / table.height,
        "steps": int(table.height),
        "samples_per_step": samples / table.height,
        "wall_s": wall,
        "world_size": world,
        "nodes": int(run.manifest.nodes),
        "partial_steps": partial,
    }
