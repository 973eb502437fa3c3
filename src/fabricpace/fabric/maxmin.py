"""Flow-level network engine: max-min fair rates by progressive filling, and flows over time.

``max_min_rates`` solves one allocation: every active flow's rate grows at the same pace (scaled by the
weight it puts on each link) until a link saturates or the flow reaches its own cap (pacing uses caps);
flows on a saturated link freeze; repeat. Rounds are event-driven: a round finds the lowest saturation
level over all links (one numpy pass) and updates only the links that the newly frozen flows cross
(sparse CSR gathers), so the cost is O(rounds x links + entries), rounds = distinct bottleneck levels.

``simulate_flows`` re-solves the allocation whenever a flow starts or finishes and returns finish times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricpace.fabric.topology import Routes

_REL = 1e-9  # relative tolerance for "this link / cap is the binding one in this round"


def _gather(ptr: np.ndarray, order: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Entries of CSR rows ``keys`` (``order[ptr[k]:ptr[k+1]]`` for every k), vectorized."""
    starts = ptr[keys]
    lens = ptr[keys + 1] - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(total)
    return order[offsets]


def max_min_rates(routes: Routes, capacity: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of every flow (same unit as ``capacity``). Flows on no link and without a cap
    get ``inf``. ``caps``: optional per-flow rate ceilings (``inf`` = none).

    Progressive filling, event by event: all active flows share one water level; a link saturates at
    level (capacity - used by frozen flows) / (active weight on it). Each round takes the lowest such
    level (or the lowest cap), freezes the flows on the saturated links at that level and updates only
    the links those flows cross, so a round costs O(links) for the minimum plus the touched entries."""
    n = routes.n_flows
    rate = np.full(n, np.inf)
    if n == 0:
        return rate
    keep = routes.weight > 0
    f, lk, w = routes.flow[keep], routes.link[keep], routes.weight[keep].astype(float)
    cap_f = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float)
    if f.size == 0:
        return cap_f.copy()
    links, li = np.unique(lk, return_inverse=True)
    n_links = links.size
    cap = np.asarray(capacity, dtype=float)[links]
    active_w = np.bincount(li, weights=w, minlength=n_links)
    used = np.zeros(n_links)
    by_link = np.argsort(li, kind="stable")
    link_ptr = np.searchsorted(li[by_link], np.arange(n_links + 1))
    by_flow = np.argsort(f, kind="stable")
    flow_ptr = np.searchsorted(f[by_flow], np.arange(n + 1))
    level_at = np.where(active_w > 0, cap / np.where(active_w > 0, active_w, 1.0), np.inf)
    active = np.ones(n, dtype=bool)
    routed = np.bincount(f, minlength=n) > 0
    rate[~routed] = cap_f[~routed]
    active &= routed
    cap_order = np.argsort(cap_f, kind="stable")
    cap_ptr = 0
    remaining = int(active.sum())
    floor = 0.0  # the water level never goes down (guards against float residue)
    while remaining:
        while cap_ptr < n and not active[cap_order[cap_ptr]]:
            cap_ptr += 1
        lam_cap = cap_f[cap_order[cap_ptr]] if cap_ptr < n else np.inf
        lam = max(floor, min(float(level_at.min()), float(lam_cap)))
        floor = lam
        if not np.isfinite(lam):
            rate[active] = np.inf
            break
        sat = np.nonzero(level_at <= lam * (1 + _REL))[0]
        on_sat = f[_gather(link_ptr, by_link, sat)]
        frozen = on_sat[active[on_sat]]
        if lam_cap <= lam * (1 + _REL):
            hi = np.searchsorted(cap_f[cap_order], lam * (1 + _REL), side="right")
            capped = cap_order[cap_ptr:hi]
            frozen = np.concatenate([frozen, capped[active[capped]]])
        frozen = np.unique(frozen)
        rate[frozen] = lam
        active[frozen] = False
        remaining -= frozen.size
        e = _gather(flow_ptr, by_flow, frozen)
        np.add.at(active_w, li[e], -w[e])
        np.add.at(used, li[e], w[e] * lam)
        touched = np.unique(li[e])
        aw = active_w[touched]
        live = aw > 1e-9
        level_at[touched] = np.inf
        level_at[touched[live]] = (cap[touched[live]] - used[touched[live]]) / aw[live]
        level_at[sat] = np.inf
    return rate


def bottleneck_links(routes: Routes, capacity: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Links that are saturated under ``rate`` (sorted by how many flows cross them, most first)."""
    used = np.bincount(routes.link, weights=routes.weight * rate[routes.flow], minlength=capacity.shape[0])
    sat = np.nonzero(used >= capacity * (1 - 1e-6))[0]
    count = np.bincount(routes.link, minlength=capacity.shape[0])
    return sat[np.argsort(-count[sat], kind="stable")]


@dataclass(frozen=True)
class FlowTimeline:
    """Result of ``simulate_flows``: per-flow finish time (s) and the number of re-solves it took."""

    finish: np.ndarray
    solves: int


def simulate_flows(
    routes: Routes,
    capacity: np.ndarray,
    sizes: np.ndarray,
    *,
    starts: np.ndarray | None = None,
    caps: np.ndarray | None = None,
) -> FlowTimeline:
    """Move ``sizes`` bytes per flow starting at ``starts`` (s); max-min rates re-solved at every start
    and finish. Returns finish times. Flows of size 0 finish at their start."""
    n = routes.n_flows
    sizes = np.asarray(sizes, dtype=float)
    start = np.zeros(n) if starts is None else np.asarray(starts, dtype=float)
    left = sizes.copy()
    finish = np.full(n, np.nan)
    done = left <= 0
    finish[done] = start[done]
    t = float(start.min()) if n else 0.0
    solves = 0
    while not done.all():
        running = (~done) & (start <= t + 1e-15)
        if not running.any():
            t = float(start[~done].min())
            continue
        sub = running[routes.flow]
        idx = np.cumsum(running) - 1
        sub_routes = Routes(
            n_flows=int(running.sum()),
            flow=idx[routes.flow[sub]],
            link=routes.link[sub],
            weight=routes.weight[sub],
        )
        r = max_min_rates(sub_routes, capacity, None if caps is None else np.asarray(caps)[running])
        solves += 1
        rate = np.zeros(n)
        rate[running] = r
        with np.errstate(divide="ignore", invalid="ignore"):
            t_fin = np.where(running & (rate > 0), left / rate, np.inf)
        pending = (~done) & (start > t + 1e-15)
        t_next_start = float(start[pending].min()) if pending.any() else np.inf
        dt = min(float(t_fin.min()), t_next_start - t)
        if not np.isfinite(dt):
            raise ValueError("flows cannot finish: a running flow has zero rate (zero-capacity link?)")
        left[running] -= rate[running] * dt
        t += dt
        now_done = running & (left <= sizes * 1e-12 + 1e-9)
        finish[now_done] = t
        done |= now_done
    return FlowTimeline(finish=finish, solves=solves)
