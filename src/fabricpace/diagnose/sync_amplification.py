"""sync_amplification: random per-step variation (GC, OS noise, data-dependent compute) becomes step
time because each synchronized step waits for *that step's* slowest rank, and the slowest rank changes
from step to step.

Loss per step = how long the median rank waits for the slowest rank that is not a persistent culprit
(persistent culprits are the straggler's finding). The finding needs that loss to reach
``sync_min_share`` of step time and the slowest-rank role to move between ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabricpace.diagnose import one_off
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import CulpritScan
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.stats import (
    block_bootstrap,
    cap_by_wait,
    expected_max_normal,
    nanmedian,
    robust_cv,
)


def residual_skew(m: RunMetrics, sc: CulpritScan) -> np.ndarray:
    """[S] ns: max over non-culprit ranks of lateness above the step's median rank."""
    keep = ~sc.culprit
    with np.errstate(all="ignore"):
        loss = np.nanmax(sc.centred[keep], axis=0) if keep.any() else np.zeros(m.n_steps)
    return np.clip(np.nan_to_num(loss), 0, None)


def _cause(m: RunMetrics, sc: CulpritScan, drop: np.ndarray | None = None) -> dict[str, float]:
    """Which kind of time the variation is made of: per step, each component of the slowest
    (non-culprit) rank above the median rank's, summed over steps, as shares of their total.
    ``drop``: steps left out (one-off stalls: what the rest of the loss is made of)."""
    keep = np.flatnonzero(~sc.culprit)
    if keep.size == 0:
        return {}
    cols = np.arange(m.n_steps)
    cen = sc.centred[keep]
    if drop is not None and drop.size:
        cols = np.setdiff1d(cols, drop)
        cen = cen[:, cols]
    sub = np.where(np.isnan(cen), -np.inf, cen)
    top = keep[np.argmax(sub, axis=0)]
    out: dict[str, float] = {}
    total = float(np.sum(np.clip(np.nan_to_num(sc.centred[top, cols]), 0, None)))
    if total <= 0:
        return out
    with np.errstate(all="ignore"):
        for name in ("compute", "data", "gc", "paced"):
            comp = m.components.get(name)
            if comp is None:
                continue
            ref = comp[keep] if cols.size == m.n_steps else comp[keep][:, cols]
            above = comp[top, cols] - nanmedian(ref, axis=0)
            out[name] = float(np.nansum(np.clip(above, 0, None)))
    norm = sum(out.values())
    return {k: v / norm for k, v in out.items()} if norm > 0 else {}


def _leading_rank(
    m: RunMetrics, sc: CulpritScan, keep: np.ndarray, drop: np.ndarray | None = None
) -> dict[str, Any] | None:
    """The non-culprit rank whose replacement alone by its peers' median saves most, with that saving
    and the next rank's (percent of step time). Real runs showed why: the demo's CPU-throttled rank
    (session 9, under load) had GC pauses twice its peers' and alone cost 34% of step time (the next
    rank 13%), yet with every rank pausing it was neither consistently nor dominantly the slowest — the
    finding was right that GC noise is amplified, and now also says where most of it comes from.
    ``drop``: steps left out (one-off stalls, which would make their rank "lead" by themselves)."""
    if keep.size < 2:
        return None
    solo = (sc.solo_without(drop, m.step_time) if drop is not None and drop.size else sc.solo_saving)[keep]
    order = np.argsort(solo)[::-1]
    return {
        "rank": int(m.ranks[keep[order[0]]]),
        "saving_pct": 100 * float(solo[order[0]]),
        "next_pct": 100 * float(solo[order[1]]),
    }


def detect(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> tuple[list[Finding], dict[str, float]]:
    loss, _ = cap_by_wait(residual_skew(m, sc), m.step_wait, m.step_time, sc.culprit)
    total = float(np.nansum(m.step_time))
    share = float(loss.sum() / total) if total > 0 else 0.0
    keep = np.flatnonzero(~sc.culprit)
    sub = np.where(np.isnan(sc.centred[keep]), -np.inf, sc.centred[keep])
    top = keep[np.argmax(sub, axis=0)] if keep.size else np.zeros(0, dtype=int)
    moving = top[loss > 0]
    distinct = int(np.unique(moving).size)
    top_share = float(np.bincount(moving).max() / moving.size) if moving.size else 0.0
    with np.errstate(all="ignore"):
        sigma = float(nanmedian(np.nanstd(sc.centred[keep], axis=0))) if keep.size else 0.0
        cv = float(np.nanstd(m.step_time) / np.nanmean(m.step_time))
    predicted = expected_max_normal(int(keep.size)) * sigma
    metrics = {
        "skew_share_of_step": share,
        "step_cv": cv,
        "step_cv_robust": robust if (robust := robust_cv(m.step_time)) is not None else float("nan"),
        "distinct_slowest_ranks": distinct,
        "slowest_rank_top_share": top_share,
        "lateness_sigma_ms": sigma / 1e6,
        "mean_skew_ms": float(loss.mean()) / 1e6 if loss.size else 0.0,
        "iid_model_skew_ms": predicted / 1e6,
    }
    if share < cfg.sync_min_share or distinct < min(3, keep.size):
        return [], metrics
    conf, ci = block_bootstrap(loss, m.step_time, cfg.sync_min_share, cfg)
    stalls = one_off.dominant_steps(loss, cfg, one_off.median_step(m))
    lead = _leading_rank(m, sc, keep, stalls)
    cause = _cause(m, sc, stalls)  # of the loss without one-off stalls (said apart, one_off.py)
    main = max(cause, key=lambda k: cause[k]) if cause else None
    evidence: dict[str, Any] = dict(metrics)
    evidence.update(
        {
            "slowest_rank_expected_share": 1.0 / max(keep.size, 1),
            "variation_made_of": cause,
            "largest_single_rank_saving": lead,
            "arrival_basis": m.arrival_basis,
            "steps": m.n_steps,
            "ranks": m.n_ranks,
        }
    )
    if main == "gc":
        rec = (
            "Garbage-collection pauses hit ranks at different steps: collect in lockstep (gc.disable() and "
            "gc.collect() every N steps on all ranks, or fabricpace pacing 'gc')."
        )
    elif main == "data":
        rec = (
            "Data-loading time varies per rank and step: prefetch deeper / add DataLoader workers so loading "
            "never sits on the critical path."
        )
    else:
        rec = (
            "Per-rank noise is amplified by synchronization: isolate training cores from OS noise, collect "
            "garbage in lockstep (fabricpace pacing 'gc'), and expect this loss to grow like σ·√(2 ln N) "
            "with "
            "more ranks."
        )
    if lead is not None and lead["saving_pct"] >= 2 * max(lead["next_pct"], 100 * cfg.straggler_min_saving):
        # A fact about this run, not a culprit: among ranks with the same noise one leads by chance now
        # and then (a real GC-on-every-rank run: 11.9% vs 5.2%), hence "if it persists".
        rec = (
            f"Of this loss, rank {lead['rank']} alone accounts for {lead['saving_pct']:.1f}% of step time "
            f"(the next rank {lead['next_pct']:.1f}%): if that persists across runs, check that host (a CPU "
            f"quota or a busy neighbour lengthens its pauses). " + rec
        )
    # What-if: every non-culprit rank at the step's median — the whole residual skew disappears.
    f = Finding(
        mode="sync_amplification",
        run=m.path,
        severity_pct=100 * share,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf,
        culprits=Culprits(ranks=[], nodes=[]),
        evidence=evidence,
        what_if_saving_pct=100 * share,
        recommendation=rec,
    )
    # One or a few steps carrying most of the loss are a stall, not amplified per-step noise: said so
    # first, with the loss without them (the leading rank above is taken without them too).
    one_off.annotate(f, m, loss, cfg.sync_min_share, cfg, stalls)
    return [f], metrics
