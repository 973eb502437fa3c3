"""Slow per sample: a rank whose own compute per sample stays well above its peers' although the
arrival times no longer show it — because pacing (``rebalance``) moved samples away from it.

Arrival-based detection judges lateness. Once the pacing controller gives a slow rank fewer samples,
that rank arrives about on time and the straggler disappears from the arrivals: a real 4-rank run
with rank 3 needing ~8x the compute per sample (``pacing="auto"``, 64% of its samples moved away at
step 108) read as ``sync_amplification`` with "collect garbage in lockstep", while the same job
without pacing read "persistent_straggler rank 3, drain or replace it". The steps table records each
rank's samples and own compute, so the hardware is still visible: compute / samples.

A rank is named when, in ≥ ``straggler_consistency`` of the steps, its compute per sample is above the
median of the other ranks', the median of that ratio over steps is ≥ ``per_sample_min_ratio`` and it
processes ≥ ``per_sample_min_moved`` fewer samples than its peers (shares were moved: without a move
the rank is late and the arrival rules name it). What-if: the culprits at the other ranks' slowest
compute per sample, every rank at the mean share: per step, the slowest rank's compute now minus that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.stats import loo_median, nanmedian


@dataclass(kw_only=True)
class PerSampleScan:
    ratio: np.ndarray  # [R] median over steps of own compute per sample / the other ranks' median
    slower_share: np.ndarray  # [R] share of steps above the other ranks' median compute per sample
    moved: np.ndarray  # [R] 1 − own samples / the other ranks' median samples (median over steps)
    culprit: np.ndarray  # [R] bool


def scan(m: RunMetrics, cfg: DiagnoseConfig) -> PerSampleScan | None:
    """None when compute or samples are not recorded per rank, or there is one rank."""
    comp, samples = m.components.get("compute"), m.samples
    if comp is None or samples is None or m.n_ranks < 2 or m.n_steps == 0:
        return None
    with np.errstate(all="ignore"):
        per = np.where(samples > 0, comp / samples, np.nan)
        if np.isnan(per).all():
            return None
        ratio_steps = per / loo_median(per)
        ratio = np.nan_to_num(nanmedian(ratio_steps, axis=1), nan=1.0)
        valid = ~np.isnan(ratio_steps)
        above = np.nansum(ratio_steps > 1, axis=1) / np.maximum(valid.sum(axis=1), 1)
        slower = np.where(valid.any(axis=1), above, 0.0)
        moved = np.nan_to_num(1.0 - nanmedian(samples / loo_median(samples), axis=1))
    culprit = (
        (ratio >= cfg.per_sample_min_ratio)
        & (slower >= cfg.straggler_consistency)
        & (moved >= cfg.per_sample_min_moved)
    )
    if culprit.sum() * 2 > m.n_ranks:
        culprit[:] = False
    return PerSampleScan(ratio=ratio, slower_share=slower, moved=moved, culprit=culprit)


def saving_per_step(m: RunMetrics, rows: np.ndarray) -> np.ndarray:
    """[S] ns: the slowest rank's compute now minus the slowest compute with the culprit rows at the
    other ranks' slowest compute per sample and every rank at the mean share of the step's samples."""
    comp, samples = m.components["compute"], m.samples
    assert samples is not None
    others = np.setdiff1d(np.arange(m.n_ranks), rows)
    with np.errstate(all="ignore"):
        per = np.where(samples > 0, comp / samples, np.nan)
        ideal = np.nanmax(per[others], axis=0) * np.nanmean(samples, axis=0)
        now = np.nanmax(comp, axis=0)
        out = np.clip(np.nan_to_num(now - ideal), 0, None)
    return np.minimum(out, np.nan_to_num(m.step_time))


def decisions(run_pacing: pl.DataFrame) -> list[dict[str, Any]]:
    """The pacing controller's decisions (pacing.parquet) as plain rows, in step order."""
    if run_pacing.height == 0:
        return []
    cols = [c for c in ("step", "rank", "policy", "action", "value", "reason") if c in run_pacing.columns]
    return run_pacing.select(cols).sort("step", maintain_order=True).to_dicts()


def first_move(rows: list[dict[str, Any]], rank: int) -> dict[str, Any] | None:
    """The first rebalance decision that moved samples away from ``rank`` (by its rank column, or a
    fleet-wide decision whose reason names it)."""
    for d in rows:
        if d.get("policy") != "rebalance" or d.get("action") not in ("enable", "adjust"):
            continue
        if d.get("rank") == rank or (d.get("rank") in (-1, None) and f"rank {rank}" in str(d.get("reason"))):
            return d
    return None
