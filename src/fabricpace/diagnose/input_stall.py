"""input_stall: the data loader is on the critical path — on all ranks (fleet-wide share of step time
spent waiting for data ≥ ``input_min_share``) or on a few ranks (culprits whose extra lateness is
mostly data time, from ``culprits.scan``).
"""

from __future__ import annotations

import numpy as np

from fabricpace.diagnose import one_off
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import CulpritScan
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.persistent_straggler import culprit_finding, culprit_nodes, split_by_cause
from fabricpace.diagnose.stats import block_bootstrap, nanmedian


def fleet_stall(m: RunMetrics, cfg: DiagnoseConfig) -> tuple[Finding | None, dict[str, float]]:
    data = m.components.get("data")
    if data is None:
        return None, {}
    total = float(np.nansum(m.step_time))
    with np.errstate(all="ignore"):
        per_rank = np.nansum(data, axis=1) / total
        fleet = float(nanmedian(per_rank))
        # The synchronized step pays at least the data wait of the median rank; with own work known,
        # the what-if is exact: steps if every rank's data wait were zero.
        if m.work is not None:
            before = np.nanmax(m.work, axis=0)
            after = np.nanmax(m.work - np.nan_to_num(data), axis=0)
            loss = np.clip(np.nan_to_num(before - after), 0, None)
        else:
            loss = np.nan_to_num(nanmedian(data, axis=0))
    metrics = {"data_share_of_step": fleet}
    if fleet < cfg.input_min_share:
        return None, metrics
    saving = float(loss.sum() / total)
    conf, ci = block_bootstrap(loss, m.step_time, cfg.input_min_share, cfg)
    ranks = [int(v) for v in m.ranks[per_rank >= cfg.input_min_share]]
    f = Finding(
        mode="input_stall",
        run=m.path,
        severity_pct=100 * saving,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf,
        culprits=Culprits(ranks=ranks, nodes=culprit_nodes(m, ranks)),
        evidence={
            "data_share_of_step": fleet,
            "data_ms_per_step_median_rank": float(nanmedian(data)) / 1e6,
            "ranks_stalled": len(ranks),
            "ranks": m.n_ranks,
            "steps": m.n_steps,
            "scope": "fleet",
        },
        what_if_saving_pct=100 * saving,
        recommendation=(
            "Every rank waits for its input pipeline: add DataLoader workers, prefetch "
            "(prefetch_factor), "
            "pin memory, move decoding/augmentation off the critical path or cache the dataset locally."
        ),
    )
    one_off.annotate(f, m, loss, cfg.input_min_share, cfg)
    return f, metrics


def detect(
    m: RunMetrics, sc: CulpritScan | None, cfg: DiagnoseConfig
) -> tuple[list[Finding], dict[str, float]]:
    fleet, metrics = fleet_stall(m, cfg)
    if fleet is not None:
        return [fleet], metrics
    if sc is None:
        return [], metrics
    _, rows = split_by_cause(m, sc, cfg)
    if rows.size == 0:
        return [], metrics
    f = culprit_finding(m, sc, rows, cfg, mode="input_stall", threshold=cfg.straggler_min_saving)
    if f is not None:
        f.evidence["scope"] = "ranks"
    return ([f] if f else []), metrics
