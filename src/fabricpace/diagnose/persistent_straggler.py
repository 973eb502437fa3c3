"""persistent_straggler: the same ranks/nodes are slower than their peers in most steps (locality-driven
variance, fail-slow hardware), so every synchronized step waits for them.

Culprits come from ``culprits.scan``; this module keeps those whose extra time is *not* mostly data
loading (those are ``input_stall``), names the locality attribute they share and computes the what-if:
replace the culprits' lateness with their peers' median and recompute each synchronized step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fabricpace.diagnose import one_off, per_sample
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import (
    CulpritScan,
    component_excess,
    component_excess_rows,
    excess_rows,
    p2p_waits,
)
from fabricpace.diagnose.findings import Culprits, Finding
from fabricpace.diagnose.locality import shared_locality, slot_names
from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.replay import queue_bound
from fabricpace.diagnose.stats import (
    block_bootstrap,
    cap_by_wait,
    fmt_ranks,
    named,
    nanmedian,
    prose_list,
    whatif_saving,
)


def nodes_of(m: RunMetrics, ranks: list[int]) -> list[int]:
    info = m.rank_info
    if info.height == 0 or "node" not in info.columns:
        return []
    sel = info.filter(info["rank"].is_in(ranks))["node"].drop_nulls().unique().sort()
    return [int(v) for v in sel.to_list()]


def culprit_nodes(m: RunMetrics, ranks: list[int]) -> list[int]:
    """The nodes that hold ``ranks``, for ``Culprits.nodes`` — none when the job runs on one node: that
    node is the whole job, and "Culprits: rank 3; node 0" on a 4-rank single-host run named the only
    host, as if draining it would help (an audit of the reports)."""
    if len(nodes_of(m, [int(v) for v in m.ranks])) <= 1:
        return []
    return nodes_of(m, ranks)


def whole_nodes(m: RunMetrics, ranks: list[int]) -> list[int]:
    """The nodes all of whose ranks are in ``ranks`` (empty on a single-node job)."""
    return [n for n in culprit_nodes(m, ranks) if set(ranks_on(m, n)) <= set(ranks)]


def ranks_on(m: RunMetrics, node: int) -> list[int]:
    info = m.rank_info
    if info.height == 0 or "node" not in info.columns:
        return []
    return [int(v) for v in info.filter(info["node"] == node)["rank"].to_list()]


# The GC cause says what lengthens the pauses, not only that they are longer: a rank under a CPU quota
# walks the same heap more slowly, and "longer GC pauses" read as "this rank makes more garbage" (user
# audit 16: the demo's rank 2, a 0.08-CPU cgroup quota, measured at GC +496 ms/step).
GC_CAUSE = "longer GC pauses (a slower CPU there — quota, throttling, a busy neighbour — or more garbage)"
GC_SHORT = "longer GC pauses"
_CAUSES = {
    "compute": "slower own compute",
    "data": "slower data loading",
    "gc": GC_CAUSE,
    "paced": "pacing delay",
}
UNEXPLAINED = "not explained by the rank's own step components"


def _cause(comp: dict[str, float], lateness_ns: float, min_share: float = 0.5) -> tuple[str, float | None]:
    """(cause, share of the lateness its component explains). A component is named only when its
    excess explains at least ``min_share`` of the lateness (the mean over steps, like the components):
    a real healthy 2-rank run was 2.5 ms late per step with 0.5 ms more compute (20%), and the finding
    said "slower own compute — drain or replace it". Otherwise the rank starts its steps late or leaves
    the previous collective late, which no step component records.

    The share is at most 1: a component's excess above the peers can be a little more than the
    lateness it explains (both are means over steps, the component against the peers' median of that
    component, the lateness against their arrivals), and "explains 208%" read as an error — an audit's
    DP-subgroup run, before lateness was judged within the subgroup. The excess itself stays in
    ``component_excess_ms``."""
    pos = {k: v for k, v in comp.items() if v > 0}
    if not pos:
        return "unknown (no step component explains the lateness)", None
    name = max(pos, key=lambda k: pos[k])
    share = min(pos[name] / lateness_ns, 1.0) if lateness_ns > 0 else None
    if share is not None and share < min_share:
        return UNEXPLAINED, share
    return _CAUSES[name], share


def split_by_cause(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> tuple[np.ndarray, np.ndarray]:
    """(straggler rows, input-stall rows): a culprit whose extra time is mostly data goes to input_stall.

    Mostly data among its components *and* a material amount: the data excess explains at least
    ``cause_min_share`` of the rank's mean lateness (the rule ``_cause`` names a cause by) and is at
    least ``straggler_min_excess`` of the mean step. Compared only with the other positive component
    excesses, a lab run's ranks 0 and 3 — 29 ms late per step of 305 ms, a ring artefact of a 20 Mbit/s
    uplink, with less compute than their peers — went to input_stall on +2.6 and +4.3 µs of data time
    ("add DataLoader workers"; audit 17 A4)."""
    rows = np.flatnonzero(sc.culprit)
    per = component_excess_rows(m, rows)
    with np.errstate(all="ignore"):
        late = np.nanmean(sc.excess[rows], axis=1) if rows.size else np.zeros(0)
    floor = cfg.straggler_min_excess * m.mean_step_ns
    stall = []
    for i, r in enumerate(rows):
        comp = {k: float(v[i]) for k, v in per.items()}
        pos = sum(v for v in comp.values() if v > 0)
        data = comp.get("data", 0.0)
        material = data >= floor and data >= cfg.cause_min_share * max(float(np.nan_to_num(late[i])), 0.0)
        if pos > 0 and data >= cfg.input_dominant_component * pos and material:
            stall.append(r)
    stall_a = np.array(stall, dtype=np.int64)
    return np.setdiff1d(rows, stall_a), stall_a


@dataclass(kw_only=True)
class Saving:
    """What replacing culprit rows by their peers' median saves (``culprit_saving``)."""

    share: float  # of step time
    per_step: np.ndarray  # [S] ns
    raw: float  # share before the wait and queue bounds
    bounded: int  # steps the wait bound cut
    queue_cut: int = 0  # steps the transfer-queue bound cut (replay.queue_bound)
    before_queue: float | None = None  # share before the transfer-queue bound (when it cut)


def culprit_saving(m: RunMetrics, sc: CulpritScan, rows: np.ndarray, cfg: DiagnoseConfig, *,
                   queue: bool = True) -> Saving:
    """What replacing the culprit ``rows`` by their peers' median saves: ``whatif_saving`` bounded by
    ``cap_by_wait`` and, where it would be reported (≥ ``straggler_min_saving``), by what the groups'
    transfer queues let the steps shrink (``replay.queue_bound``): a slow rank's backward can hide
    the other ranks' bucket transfers, which become exposed once it is gone (planner audit 16: 10.1%
    read where the simulated counterfactual saves 3.9%)."""
    mask = np.zeros(m.n_ranks, dtype=bool)
    mask[rows] = True
    raw, per_step = whatif_saving(sc.centred, mask, m.step_time, m.sets)
    per_step, bounded = cap_by_wait(per_step, m.step_wait, m.step_time, mask)
    total = float(np.nansum(m.step_time))
    saving = float(per_step.sum()) / total if total > 0 else 0.0
    out = Saving(share=saving, per_step=per_step, raw=raw, bounded=bounded)
    if queue and saving >= cfg.straggler_min_saving:
        q = queue_bound(m, rows, cfg)
        cut = per_step > q if q is not None else None
        if cut is not None and cut.any():
            out.per_step = np.where(cut, q, per_step)  # type: ignore[arg-type]
            out.share = float(out.per_step.sum()) / total
            out.queue_cut = int(cut.sum())
            out.before_queue = saving
    return out


def rank_causes(
    m: RunMetrics, sc: CulpritScan, rows: np.ndarray, cfg: DiagnoseConfig
) -> tuple[list[tuple[str, float | None]], np.ndarray]:
    """(cause and share of each culprit row, judged on its own components and lateness; the rows' mean
    lateness, ns). Per culprit, not on the culprits' mean: a pipeline job with one slow stage-1 rank
    also named its stage-0 peer, whose compute was not slow at all, and the mean of the two (+20 ms and
    0 ms) read "slower own compute" for both (an audit's What-if import)."""
    per = component_excess_rows(m, rows)
    with np.errstate(all="ignore"):
        late = np.nanmean(sc.excess[rows], axis=1)
    causes = [
        _cause({k: float(v[i]) for k, v in per.items()}, float(late[i]), cfg.cause_min_share)
        for i in range(rows.size)
    ]
    return causes, late


def downstream(
    m: RunMetrics,
    rows: np.ndarray,
    causes: list[tuple[str, float | None]],
    late: np.ndarray,
    cfg: DiagnoseConfig,
) -> dict[int, dict[str, Any]]:
    """Culprit rows that are late only because they wait on another culprit through the pipeline: row ->
    {waits_on: the culprit row it waited on most in point-to-point transfers, root: the culprit with its
    own cause at the end of that chain, p2p_excess_ns, share}. A row qualifies when its own components
    do not explain its lateness, its point-to-point waits above its peers' explain ≥ ``cause_min_share``
    of it, and the rank it waited on most there is a culprit with an own cause (or downstream of one).
    A stage-0 rank waits in its backward receives for a slow stage-1 rank and so reaches its stage's
    gradient reduce-scatter late every step; fixing the stage-1 rank fixes it too."""
    pw = p2p_waits(m)
    if pw is None or rows.size < 2:
        return {}
    per_step, on = pw
    exc = excess_rows(m, rows, {"p2p": per_step}).get("p2p")
    if exc is None:
        return {}
    root = {int(r): int(r) for r, (c, _) in zip(rows, causes, strict=True) if c in _CAUSES.values()}
    out: dict[int, dict[str, Any]] = {}
    changed = bool(root)
    while changed:  # a chain through the stages: at most one pass per stage
        changed = False
        for i, r in enumerate(int(v) for v in rows):
            if r in root or not late[i] > 0 or not exc[i] >= cfg.cause_min_share * late[i]:
                continue
            src = int(np.argmax(on[r]))
            if on[r, src] <= 0 or src not in root:
                continue
            root[r] = root[src]
            out[r] = {
                "waits_on": src,
                "root": root[src],
                "p2p_excess_ns": float(exc[i]),
                "share": min(float(exc[i] / late[i]), 1.0),
            }
            changed = True
    return out


def _group_cause(
    m: RunMetrics, rows: np.ndarray, causes: list[tuple[str, float | None]]
) -> tuple[str, float | None, dict[str, list[int]]]:
    """(the culprits' cause in words, the share it explains (None when they differ), ranks by cause)."""
    by: dict[str, list[int]] = {}
    for r, (c, _) in zip(rows, causes, strict=True):
        by.setdefault(c, []).append(int(m.ranks[r]))
    if len(by) == 1:
        shares = [sh for _, sh in causes if sh is not None]
        return causes[0][0], (float(np.median(shares)) if shares else None), by
    return "; ".join(f"{named('rank', rk)}: {c}" for c, rk in by.items()), None, by


def culprit_finding(
    m: RunMetrics, sc: CulpritScan, rows: np.ndarray, cfg: DiagnoseConfig, *, mode: str, threshold: float
) -> Finding | None:
    """A finding for the culprit rows (straggler or rank-level input stall); None below threshold.

    The severity is the what-if of all ``rows``; a straggler row that is late only because it waits on
    another culprit through the pipeline (``downstream``) is no culprit of its own: it is named in the
    evidence (``downstream_ranks``) and the recommendation, and the rest of the evidence describes the
    other rows."""
    sv = culprit_saving(m, sc, rows, cfg)
    saving, per_step, raw, bounded = sv.share, sv.per_step, sv.raw, sv.bounded
    if saving < threshold:
        return None
    conf, ci = block_bootstrap(per_step, m.step_time, threshold, cfg)
    causes, late = rank_causes(m, sc, rows, cfg)
    down = downstream(m, rows, causes, late, cfg) if mode == "persistent_straggler" else {}
    own = np.array([int(r) not in down for r in rows], dtype=bool)
    causes = [c for c, k in zip(causes, own, strict=True) if k]
    rows = rows[own]
    ranks = [int(v) for v in m.ranks[rows]]
    mean_step = float(np.nanmean(m.step_time))
    comp = component_excess(m, rows)
    mean_late = float(nanmedian(late[own]))
    cause, explained, by_cause = _group_cause(m, rows, causes)
    share, expected = sc.last_share(rows)
    # Median and mean lateness side by side: they part when the lateness comes in rare long pauses
    # (GC), and the severity follows the mean — an audit read "late by 62 ms/step" (the median) beside
    # a 63.7% severity that 659 ms of mean lateness (gc +596 ms) made.
    evidence: dict[str, Any] = {
        "last_arriver_share": share,
        "last_arriver_share_expected": expected,
        "median_lateness_ms": float(np.median(sc.median_excess[rows])) / 1e6,
        "mean_lateness_ms": mean_late / 1e6,
        "lateness_share_of_step": float(np.median(sc.median_excess[rows])) / mean_step,
        "mean_lateness_share_of_step": mean_late / mean_step,
        "slower_than_peers_share_of_steps": float(np.min(sc.slower_share[rows])),
        "score_fleet_over_own": _score(m, rows),
        "component_excess_ms": {k: v / 1e6 for k, v in comp.items()},
        "cause": cause,
        "cause_explains_share": explained,
        "arrival_basis": m.arrival_basis,
        "steps": m.n_steps,
        "ranks": m.n_ranks,
    }
    if len(by_cause) > 1:
        evidence["cause_by_rank"] = {
            str(int(m.ranks[r])): c for r, (c, _) in zip(rows, causes, strict=True)
        }
    if down:
        evidence["downstream_ranks"] = {
            str(int(m.ranks[r])): {
                "waits_on_rank": int(m.ranks[d["waits_on"]]),
                "p2p_wait_excess_ms": d["p2p_excess_ns"] / 1e6,
                "explains_share": d["share"],
            }
            for r, d in down.items()
        }
    if bounded or sv.queue_cut:  # lateness beyond what the waiting ranks were blocked (cap_by_wait)
        evidence["whatif_bounded_steps"] = bounded
        evidence["whatif_from_lateness_pct"] = 100 * raw
    if sv.queue_cut and sv.before_queue is not None:  # transfers the culprits' lateness was hiding
        evidence["whatif_exposed_transfer_steps"] = sv.queue_cut
        evidence["whatif_before_exposed_transfer_pct"] = 100 * sv.before_queue
    if len(m.sets) > 1:  # judged within the ranks it synchronizes with, not against the whole job
        peers = sorted({int(v) for st in m.sets if np.isin(st, rows).any() for v in m.ranks[st]})
        evidence["compared_with_ranks"] = peers
    loc = shared_locality(ranks, m.rank_info, [int(v) for v in m.ranks])
    evidence["shared_locality"] = loc
    nodes = culprit_nodes(m, ranks)
    where, many = _where(ranks, loc)
    it = "them" if many else "it"
    its = "their" if many else "its"
    unexplained = by_cause.get(UNEXPLAINED, [])
    brief = cause.replace(GC_CAUSE, GC_SHORT)  # the GC sentence after it (_gc_text) says what lengthens them
    if mode == "persistent_straggler" and cause == UNEXPLAINED:
        top = max(comp, key=lambda k: comp[k]) if comp else None
        amount = f"{comp[top] / 1e6:.2f} ms" if top is not None and comp[top] >= 1e4 else (
            f"{comp[top] / 1e3:.1f} µs" if top is not None else ""
        )  # "+0.00 ms" read as nothing measured; a lab run's data excess was +4.3 µs
        part = f" ({top} +{amount})" if top is not None and comp[top] > 0 else ""
        rec = (
            f"The job waits for {where} in most steps, but {its} own step components{part} explain only "
            f"{max(explained or 0.0, 0.0):.0%} of {its} lateness ({mean_late / 1e6:.2f} ms/step): "
            f"{'they' if many else 'it'} "
            f"{'start their' if many else 'starts its'} steps late or {'leave' if many else 'leaves'} the "
            "previous collective late. Look at what else runs on that host (CPU scheduling, logging, "
            "other processes) before suspecting the hardware; shifting samples away will not help."
        )
    elif mode == "persistent_straggler" and cause == GC_CAUSE:
        rec = (
            f"The job waits for {where} in most steps: {its} GC pauses are longer than {its} peers' "
            f"({_ms_per_step(comp.get('gc', 0.0))} of GC time above them). Either a slower CPU there or "
            "more garbage lengthens them: check that host for a CPU quota or throttling (cgroup cpu.max "
            "or cpu.cfs_quota_us, nr_throttled in cpu.stat) and for busy neighbours first; if "
            f"{it} {'do' if many else 'does'} make more garbage, allocate less there "
            f"(fewer short-lived objects) or shift samples away from {it} (fabricpace pacing 'rebalance')."
        )
    elif mode == "persistent_straggler" and unexplained:
        hw = sorted(set(ranks) - set(unexplained))
        several = len(unexplained) > 1
        rec = (
            f"The job waits for {where} in most steps ({brief}). For {named('rank', hw)}: check that "
            f"hardware (thermals, clocks, PCIe/NIC errors, noisy neighbours), drain or replace "
            f"{'them' if len(hw) > 1 else 'it'}, or shift samples away (fabricpace pacing 'rebalance'). "
            f"{named('rank', unexplained).capitalize()} {'start their' if several else 'starts its'} steps "
            f"late or {'leave' if several else 'leaves'} the previous collective late: look at what else "
            "runs on that host before suspecting the hardware."
        )
    elif mode == "persistent_straggler":
        rec = (
            f"The job waits for {where} in most steps ({brief}). Check that hardware (thermals, "
            f"clocks, PCIe/NIC errors, noisy neighbours), drain or replace {it}, or shift samples away from "
            f"{it} (fabricpace pacing 'rebalance')."
        )
    else:
        rec = (
            f"{where[0].upper()}{where[1:]} {'wait' if many else 'waits'} on the data loader more than "
            f"{'their' if many else 'its'} peers: check that node's storage/CPU, add "
            f"DataLoader workers or prefetching there, or shift samples away from {it} (pacing 'rebalance')."
        )
    if mode == "persistent_straggler" and len(by_cause) > 1 and GC_CAUSE in by_cause:
        rec += " " + _gc_text(m, rows, by_cause[GC_CAUSE])
    if down:
        rec += " " + _downstream_text(m, down)
    stages = sorted({int(v) for v in m.stage_of_rank[rows]}) if m.stage_of_rank is not None else []
    f = Finding(
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
    one_off.annotate(f, m, per_step, threshold, cfg)  # a single stall carrying most of it is said so
    return f


def _ms_per_step(ns: float) -> str:
    """'+496 ms/step', '+6.2 ms/step' (a mean excess over the peers, ns)."""
    ms = ns / 1e6
    return f"{ms:+.0f} ms/step" if abs(ms) >= 10 else f"{ms:+.1f} ms/step"


def _gc_text(m: RunMetrics, rows: np.ndarray, gc_ranks: list[int]) -> str:
    """The GC sentence for the culprits among several causes whose cause is GC: 'For rank 9, GC pauses
    are longer (+6.2 ms/step): a slower CPU there ... or more garbage ...'."""
    per = component_excess_rows(m, rows).get("gc")
    idx = [i for i, r in enumerate(rows) if int(m.ranks[r]) in gc_ranks]
    gc = float(nanmedian(per[idx])) if per is not None and idx else 0.0
    many = len(gc_ranks) > 1
    return (
        f"For {named('rank', gc_ranks)}, GC pauses are longer ({_ms_per_step(gc)}): either a slower CPU "
        "there (a CPU quota, throttling, a busy neighbour) or more garbage lengthens them, so check that "
        f"host's CPU quota and neighbours before {'their' if many else 'its'} allocations."
    )


def _downstream_text(m: RunMetrics, down: dict[int, dict[str, Any]]) -> str:
    """'Rank 2 (stage 0) arrives late only because it waits on rank 6 through the pipeline (...): fixing
    rank 6 fixes it too.' — one sentence per root."""
    out = []
    for root in dict.fromkeys(d["root"] for d in down.values()):
        mine = [r for r, d in down.items() if d["root"] == root]
        who = named("rank", [int(m.ranks[r]) for r in mine])
        if m.stage_of_rank is not None:
            st = sorted({int(m.stage_of_rank[r]) for r in mine})
            who += f" ({named('stage', st)})"
        many = len(mine) > 1
        exc = max(down[r]["p2p_excess_ns"] for r in mine) / 1e6
        src = sorted({int(m.ranks[down[r]["waits_on"]]) for r in mine})
        out.append(
            f"{who[0].upper()}{who[1:]} {'arrive' if many else 'arrives'} late only because "
            f"{'they wait' if many else 'it waits'} on {named('rank', src)} through the pipeline (up to "
            f"+{exc:.2f} ms/step of point-to-point waits above {'their' if many else 'its'} stage's other "
            f"ranks): not a culprit of {'their' if many else 'its'} own — fixing rank {int(m.ranks[root])} "
            f"fixes {'them' if many else 'it'} too."
        )
    return " ".join(out)


def left_out(
    m: RunMetrics, sc: CulpritScan, named_ranks: set[int], cfg: DiagnoseConfig
) -> dict[str, Any] | None:
    """The culprit ranks of the scan that no finding names: they stay out of sync_amplification's loss
    (it counts the slowest *non-culprit* rank) but are not reported, being below the straggler's
    saving threshold. Before, nothing said so — an audit's 128-rank run: node 13 was the last arriver
    in most collectives and the report's tables named it, while the only finding (sync_amplification,
    "Culprits: –") had silently left its 8 ranks out ("expected share" 1/120, not 1/128). None when
    every culprit is named."""
    rows = np.flatnonzero(sc.culprit & ~np.isin(m.ranks, sorted(named_ranks)))
    if rows.size == 0:
        return None
    ranks = [int(v) for v in m.ranks[rows]]
    # Without the queue bound: it costs one more pass over the collectives per culprit set, and this
    # only words a note about culprits no finding names (the review of audit 16, M3).
    saving = culprit_saving(m, sc, rows, cfg, queue=False).share
    share, expected = sc.last_share(rows)
    whole = whole_nodes(m, ranks)
    on_whole = sorted(r for n in whole for r in ranks_on(m, n))
    if whole and on_whole == sorted(ranks):
        who = f"{named('node', whole)} (ranks {fmt_ranks(ranks)})"
    else:
        who = named("rank", ranks, limit=6)
    many = len(whole) > 1 if whole and on_whole == sorted(ranks) else len(ranks) > 1
    thr = cfg.straggler_min_saving
    amount = f"{saving:.1%}" if saving >= thr or f"{saving:.1%}" != f"{thr:.1%}" else f"{saving:.2%}"
    save = (
        f"would save only {amount} of step time, below the {thr:.0%} from which a straggler is reported"
        if saving < thr
        else f"would save {amount} of step time (a straggler is reported from {thr:.0%})"
    )
    note = (
        f"{who} arrived last in {share:.0%} of steps ({expected:.0%} if nothing were wrong), but replacing "
        f"{'them' if many else 'it'} {save}: not reported as a straggler, and left out of "
        "sync_amplification's loss"
    )
    return {
        "ranks": ranks,
        "nodes": whole,
        "last_arriver_share": share,
        "last_arriver_share_expected": expected,
        "saving_pct": 100 * saving,
        "threshold_pct": 100 * cfg.straggler_min_saving,
        "note": note,
    }


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


def per_sample_finding(
    m: RunMetrics, ps: per_sample.PerSampleScan, rows: np.ndarray, cfg: DiagnoseConfig
) -> Finding | None:
    """A straggler that pacing hid: slow per sample, with samples moved away (``per_sample``)."""
    per_step = per_sample.saving_per_step(m, rows)
    total = float(np.nansum(m.step_time))
    saving = float(per_step.sum()) / total if total > 0 else 0.0
    if saving < cfg.straggler_min_saving:
        return None
    conf, ci = block_bootstrap(per_step, m.step_time, cfg.straggler_min_saving, cfg)
    ranks = [int(v) for v in m.ranks[rows]]
    moves = per_sample.decisions(m.run.pacing)
    said = []
    per_rank = {}
    for r, rank in zip(rows, ranks, strict=True):
        first = per_sample.first_move(moves, rank)
        where = f" (pacing.parquet step {first['step']})" if first else ""
        said.append(
            f"rank {rank}: {ps.ratio[r]:.1f}x the median compute per sample; pacing moved "
            f"{ps.moved[r]:.0%} of its samples away{where}"
        )
        per_rank[str(rank)] = {
            "compute_per_sample_ratio": float(ps.ratio[r]),
            "samples_moved_share": float(ps.moved[r]),
            "slower_per_sample_share_of_steps": float(ps.slower_share[r]),
            "first_move_step": int(first["step"]) if first else None,
        }
    loc = shared_locality(ranks, m.rank_info, [int(v) for v in m.ranks])
    where, many = _where(ranks, loc)
    it = "them" if many else "it"
    evidence: dict[str, Any] = {
        "route": "compute per sample (pacing moved samples away, so arrivals no longer show it)",
        "per_rank": per_rank,
        "compute_per_sample_ratio": float(np.min(ps.ratio[rows])),
        "samples_moved_share": float(np.min(ps.moved[rows])),
        "pacing_decisions": len(moves),
        "cause": "slower own compute (per sample)",
        "shared_locality": loc,
        "steps": m.n_steps,
        "ranks": m.n_ranks,
    }
    rec = (
        "; ".join(said)
        + f". Pacing keeps the job from waiting for {where}, but {it} still "
        f"{'cost' if many else 'costs'} about {100 * saving:.1f}% of step time against healthy hardware "
        f"at equal shares. Check that hardware (thermals, clocks, PCIe/NIC errors, noisy neighbours), "
        f"drain or replace {it}."
    )
    stages = sorted({int(v) for v in m.stage_of_rank[rows]}) if m.stage_of_rank is not None else []
    return Finding(
        mode="persistent_straggler",
        run=m.path,
        severity_pct=100 * saving,
        severity_ci_pct=(100 * ci[0], 100 * ci[1]),
        confidence=conf,
        culprits=Culprits(ranks=ranks, nodes=culprit_nodes(m, ranks), stages=stages),
        evidence=evidence,
        what_if_saving_pct=100 * saving,
        recommendation=rec,
    )


def detect(
    m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig, ps: per_sample.PerSampleScan | None = None
) -> list[Finding]:
    """Arrival-based stragglers, and (``ps``) ranks slow per sample that pacing moved samples away
    from; a rank found both ways gets one finding, with the per-sample evidence added."""
    rows, _ = split_by_cause(m, sc, cfg)
    out: list[Finding] = []
    if rows.size:
        f = culprit_finding(m, sc, rows, cfg, mode="persistent_straggler", threshold=cfg.straggler_min_saving)
        if f:
            out.append(f)
    if ps is not None and ps.culprit.any():
        named_rows = rows if out else np.zeros(0, dtype=np.int64)
        hidden = np.setdiff1d(np.flatnonzero(ps.culprit), named_rows)
        both = np.intersect1d(np.flatnonzero(ps.culprit), named_rows)
        if out and both.size:
            out[0].evidence["compute_per_sample_ratio"] = {
                str(int(m.ranks[r])): float(ps.ratio[r]) for r in both
            }
        if hidden.size:
            f2 = per_sample_finding(m, ps, hidden, cfg)
            if f2:
                out.append(f2)
    return out
