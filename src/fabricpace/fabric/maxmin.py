"""Flow-level network engine: max-min fair rates by progressive filling, and flows over time.

``max_min_rates`` solves one allocation: every active flow's rate grows at the same pace (scaled by the
weight it puts on each link) until a link saturates or the flow reaches its own cap (pacing uses caps);
flows on a saturated link freeze; repeat. Each round is a handful of numpy passes over the sparse
flow x link incidence (``np.bincount``), so a round costs O(nnz) and the number of rounds is the number
of distinct bottleneck levels, not the number of flows.

``simulate_flows`` re-solves the allocation whenever a flow starts or finishes and returns finish times.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fabricpace.fabric.topology import Routes

_REL = 1e-9  # relative tolerance for "this link / cap is the binding one in this round"


def max_min_rates(routes: Routes, capacity: np.ndarray, caps: np.ndarray | None = None) -> np.ndarray:
    """Max-min fair rate of every flow (same unit as ``capacity``). Flows on no link and without a cap
    get ``inf``. ``caps``: optional per-flow rate ceilings (``inf`` = none)."""
    n = routes.n_flows
    rate = np.zeros(n)
    if n == 0:
        return rate
    cap = np.full(n, np.inf) if caps is None else np.asarray(caps, dtype=float).copy()
    rem = np.asarray(capacity, dtype=float).copy()
    keep = routes.weight > 0
    f, lk, w = routes.flow[keep], routes.link[keep], routes.weight[keep]
    active = np.ones(n, dtype=bool)
    n_links = rem.shape[0]
    while True:
        live = active[f]
        f, lk, w = f[live], lk[live], w[live]
        load = np.bincount(lk, weights=w, minlength=n_links)
        used = load > 0
        share = np.full(n_links, np.inf)
        share[used] = np.maximum(rem[used], 0.0) / load[used]
        d_link = share.min() if used.any() else np.inf
        headroom = cap - rate
        d_cap = headroom[active].min()
        d = min(d_link, d_cap)
        if not np.isfinite(d):
            rate[active] = np.inf
            break
        rate[active] += d
        rem[used] -= d * load[used]
        frozen = np.zeros(n, dtype=bool)
        sat = used & (share <= d * (1 + _REL) + 1e-300)
        frozen[f[sat[lk]]] = True
        frozen |= active & (headroom <= d * (1 + _REL))
        active &= ~frozen
        if not active.any():
            break
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
