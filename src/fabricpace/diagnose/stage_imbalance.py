"""stage_imbalance: pipeline stages with unequal per-step work, so the slowest stage sets the pace of
the whole pipeline while the others idle in bubbles.

Stage of a rank: ``ranks.pp_stage``, else a ``stage`` tag on ``ops`` rows. Work of a rank in a step:
``steps.compute_ns``, else the sum of its non-communication ``ops`` durations. Per step, a stage's
work is the median over its ranks. A stage is the culprit when its median work exceeds the other
stages' median by ≥ ``stage_min_excess`` in most steps; the what-if replaces its work by the other
stages' median and recomputes the step as paced by the slowest stage.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from fabricpace.diagnose import one_off
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.metrics import RunMetrics, _dense
from fabricpace.diagnose.persistent_straggler import culprit_nodes
from fabricpace.diagnose.stats import block_bootstrap, loo_median, named, nanmedian

_COMM = (
    r"(?i)(comm|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|broadcast|"
    r"send|recv|nccl|gloo|c10d|barrier)"
)


def _stage_and_work(m: RunMetrics) -> tuple[np.ndarray | None, np.ndarray | None, str]:
    stage = m.stage_of_rank
    ops = m.run.ops
    if stage is None and ops.height and "stage" in ops.columns and ops["stage"].drop_nulls().n_unique() >= 2:
        per = ops.group_by("rank").agg(pl.col("stage").drop_nulls().first())
        stage = np.full(m.n_ranks, -1, dtype=np.int64)
        idx = np.searchsorted(m.ranks, per["rank"].to_numpy())
        ok = (idx < m.n_ranks) & per["stage"].is_not_null().to_numpy()
        stage[idx[ok]] = per["stage"].to_numpy()[ok]
    if stage is None:
        return None, None, ""
    work = m.components.get("compute")
    source = "steps.compute_ns"
    if (work is None or np.isnan(work).all()) and ops.height:
        comp = ops.filter(~pl.col("op").cast(pl.String).str.contains(_COMM))
        per = comp.group_by(["rank", "step"]).agg(pl.col("dur_ns").sum())
        work = _dense(per, "dur_ns", m.ranks, m.steps)
        source = "ops (non-communication durations)"
    if work is None or np.isnan(work).all():
        return stage, None, ""
    return stage, work, source


def detect(m: RunMetrics, cfg: DiagnoseConfig) -> tuple[list[Finding], dict[str, Any], str | None]:
    """(findings, metrics, reason it does not apply or None)."""
    stage, work, source = _stage_and_work(m)
    if stage is None:
        return [], {}, "no pipeline stages recorded (ranks.pp_stage / ops stage)"
    if work is None:
        return [], {}, "pipeline stages known but no per-rank work (steps.compute_ns or ops)"
    ids = np.unique(stage[stage >= 0])
    if ids.size < 2:
        return [], {}, "fewer than two pipeline stages"
    with np.errstate(all="ignore"):
        sw = np.vstack([nanmedian(work[stage == k], axis=0) for k in ids])  # [K, S]
        ex = sw - loo_median(sw)
        rel = nanmedian(ex, axis=1) / nanmedian(sw)
        slower = np.nanmean(ex > 0, axis=1)
    metrics = {
        "stage_work_ms": {int(k): float(nanmedian(sw[i])) / 1e6 for i, k in enumerate(ids)},
        "stage_max_over_median": float(np.nanmax(nanmedian(sw, axis=1)) / nanmedian(sw)),
    }
    hot = (rel >= cfg.stage_min_excess) & (slower >= cfg.straggler_consistency)
    if not hot.any() or hot.sum() * 2 > ids.size:
        return [], metrics, None
    others = ~hot
    with np.errstate(all="ignore"):
        fill = nanmedian(sw[others], axis=0)
        new = sw.copy()
        new[hot] = fill
        per_step = np.clip(np.nan_to_num(np.nanmax(sw, axis=0) - np.nanmax(new, axis=0)), 0, None)
    total = float(np.nansum(m.step_time))
    saving = float(per_step.sum() / total) if total > 0 else 0.0
    if saving < cfg.stage_min_saving:
        return [], metrics, None
    conf, ci = block_bootstrap(per_step, m.step_time, cfg.stage_min_saving, cfg)
    stages = [int(k) for k in ids[hot]]
    ranks = [int(r) for r in m.ranks[np.isin(stage, stages)]]
    fastest = int(ids[int(np.nanargmin(nanmedian(sw, axis=1)))])
    evidence = dict(metrics)
    evidence.update(
        {
            "slow_stage_excess_over_median_stage": float(np.max(rel[hot])),
            "slow_stage_slower_share_of_steps": float(np.min(slower[hot])),
            "work_source": source,
            "stages": int(ids.size),
            "steps": m.n_steps,
        }
    )
    f = Finding(
        mode="stage_imbalance",
        run=m.path,
        severity_pct=100 * saving,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf,
        culprits=Culprits(ranks=ranks, nodes=culprit_nodes(m, ranks), stages=stages),
        evidence=evidence,
        what_if_saving_pct=100 * saving,
        recommendation=(
            f"Pipeline {named('stage', stages)} {'carry' if len(stages) > 1 else 'carries'} more "
            f"work than the others: move layers from {'them' if len(stages) > 1 else 'it'} to "
            f"stage {fastest} (the lightest), or rebalance the partition by measured time, "
            "not layer count."
        ),
    )
    one_off.annotate(f, m, per_step, cfg.stage_min_saving, cfg)
    return [f], metrics, None
