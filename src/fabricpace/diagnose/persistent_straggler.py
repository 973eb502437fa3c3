"""persistent_straggler: the same ranks/nodes are slower than their peers in most steps (locality-driven
variance, fail-slow hardware), so every synchronized step waits for them.

Culprits come from ``culprits.scan``; this module keeps those whose extra time is *not* mostly data
loading (those are ``input_stall``), names the locality attribute they share and computes the what-if:
replace the culprits' lateness with their peers' median and recompute each synchronized step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import CulpritScan, component_excess, component_excess_rows
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.locality import shared_locality, slot_names
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.stats import block_bootstrap, named, nanmedian, prose_list, whatif_saving


def nodes_of(m: RunMetrics, ranks: list[int]) -> list[int]:
    info = m.rank_info
    if info.height == 0 or "node" not in info.columns:
        return []
    sel = info.filter(info["rank"].is_in(ranks))["node"].drop_nulls().unique().sort()
    return [int(v) for v in sel.to_list()]


def _cause(comp: dict[str, float]) -> str:
    pos = {k: v for k, v in comp.items() if v > 0}
    if not pos:
        return "unknown (no step component explains the lateness)"
    name = max(pos, key=lambda k: pos[k])
    return {
        "compute": "slower own compute",
        "data": "slower data loading",
        "gc": "longer GC pauses",
        "paced": "pacing delay",
    }[name]


def split_by_cause(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> tuple[np.ndarray, np.ndarray]:
    """(straggler rows, input-stall rows): a culprit whose extra time is mostly data goes to input_stall."""
    rows = np.flatnonzero(sc.culprit)
    per = component_excess_rows(m, rows)
    stall = []
    for i, r in enumerate(rows):
        comp = {k: float(v[i]) for k, v in per.items()}
        pos = sum(v for v in comp.values() if v > 0)
        if pos > 0 and comp.get("data", 0.0) >= cfg.input_dominant_component * pos:
            stall.append(r)
    stall_a = np.array(stall, dtype=np.int64)
    return np.setdiff1d(rows, stall_a), stall_a


def culprit_finding(
    m: RunMetrics, sc: CulpritScan, rows: np.ndarray, cfg: DiagnoseConfig, *, mode: str, threshold: float
) -> Finding | None:
    """A finding for the culprit rows (straggler or rank-level input stall); None below threshold."""
    mask = np.zeros(m.n_ranks, dtype=bool)
    mask[rows] = True
    saving, per_step = whatif_saving(sc.centred, mask, m.step_time)
    if saving < threshold:
        return None
    conf, ci = block_bootstrap(per_step, m.step_time, threshold, cfg)
    ranks = [int(v) for v in m.ranks[rows]]
    mean_step = float(np.nanmean(m.step_time))
    comp = component_excess(m, rows)
    share = float(sc.last_count[rows].sum() / max(sc.last_steps, 1))
    evidence = {
        "last_arriver_share": share,
        "last_arriver_share_expected": len(rows) / m.n_ranks,
        "median_lateness_ms": float(np.median(sc.median_excess[rows])) / 1e6,
        "lateness_share_of_step": float(np.median(sc.median_excess[rows])) / mean_step,
        "slower_than_peers_share_of_steps": float(np.min(sc.slower_share[rows])),
        "score_fleet_over_own": _score(m, rows),
        "component_excess_ms": {k: v / 1e6 for k, v in comp.items()},
        "cause": _cause(comp),
        "arrival_basis": m.arrival_basis,
        "steps": m.n_steps,
        "ranks": m.n_ranks,
    }
    loc = shared_locality(ranks, m.rank_info, [int(v) for v in m.ranks])
    evidence["shared_locality"] = loc
    nodes = nodes_of(m, ranks)
    where, many = _where(ranks, loc)
    it = "them" if many else "it"
    if mode == "persistent_straggler":
        rec = (
            f"The job waits for {where} in most steps ({_cause(comp)}). Check that hardware (thermals, "
            f"clocks, PCIe/NIC errors, noisy neighbours), drain or replace {it}, or shift samples away from "
            f"{it} (fabricpace pacing 'rebalance')."
        )
    else:
        rec = (
            f"{where[0].upper()}{where[1:]} {'wait' if many else 'waits'} on the data loader more than "
            f"{'their' if many else 'its'} peers: check that node's storage/CPU, add "
            f"DataLoader workers or prefetching there, or shift samples away from {it} (pacing 'rebalance')."
        )
    stages = sorted({int(v) for v in m.stage_of_rank[rows]}) if m.stage_of_rank is not None else []
    return Finding(
        mode=mode,
        run=m.path,
        severity_pct=100 * saving,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf,
        culprits=Culprits(ranks=ranks, nodes=nodes, stages=stages),
        evidence=evidence,
        what_if_saving_pct=100 * saving,
        recommendation=rec,
    )


def _where(ranks: list[int], loc: dict[str, Any] | None) -> tuple[str, bool]:
    """Who the job waits for, in words, and whether that is several things: 'node 2', 'rank 5 (GPU1 on
    node 1)', 'ranks 3 and 7 (NIC mlx5_0)'. A node or leaf is named by itself; a GPU/NIC/NUMA slot goes
    with its ranks (a slot name alone, '1:GPU1', means nothing to the reader)."""
    if loc and loc["attribute"] in ("node", "leaf"):
        return named(loc["attribute"], loc["values"]), len(loc["values"]) > 1
    who = named("rank", ranks)
    if loc:
        who += f" ({prose_list(slot_names(loc['attribute'], loc['values']))})"
    return who, len(ranks) > 1


def _score(m: RunMetrics, rows: np.ndarray) -> float | None:
    """Median own work of the other ranks / the culprits' (NVIDIA's straggler score; < 1 = slower)."""
    if m.work is None:
        return None
    others = np.setdiff1d(np.arange(m.n_ranks), rows)
    if others.size == 0:
        return None
    own = float(nanmedian(m.work[rows]))
    fleet = float(nanmedian(m.work[others]))
    return fleet / own if own > 0 else None


def detect(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> list[Finding]:
    rows, _ = split_by_cause(m, sc, cfg)
    if rows.size == 0:
        return []
    f = culprit_finding(m, sc, rows, cfg, mode="persistent_straggler", threshold=cfg.straggler_min_saving)
    return [f] if f else []
