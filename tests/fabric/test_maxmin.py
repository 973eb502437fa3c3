"""Max-min fair sharing: textbook cases, per-flow caps, re-solving over time, and the max-min property."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricpace.fabric.maxmin import bottleneck_links, max_min_rates, simulate_flows
from fabricpace.fabric.topology import Routes


def routes(paths: list[list[int]], weights: list[list[float]] | None = None) -> Routes:
    flow = np.concatenate([np.full(len(p), i) for i, p in enumerate(paths)]).astype(np.int64)
    link = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths])
    w = np.ones(link.shape[0]) if weights is None else np.concatenate([np.asarray(x, float) for x in weights])
    return Routes(n_flows=len(paths), flow=flow, link=link, weight=w)


def test_one_link_shared_equally():
    r = max_min_rates(routes([[0], [0], [0]]), np.array([3.0]))
    np.testing.assert_allclose(r, [1.0, 1.0, 1.0])


def test_parking_lot_long_flow_gets_the_fair_share_of_its_tightest_link():
    # f0 crosses L0 and L1; f1 only L0; f2 only L1. L0 = 1, L1 = 2.
    r = max_min_rates(routes([[0, 1], [0], [1]]), np.array([1.0, 2.0]))
    np.testing.assert_allclose(r, [0.5, 0.5, 1.5])


def test_classic_three_link_example():
    # Bertsekas & Gallager style: links cap 1; f0 on all three links, f1..f3 on one link each.
    r = max_min_rates(routes([[0, 1, 2], [0], [1], [2]]), np.array([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(r, [0.5, 0.5, 0.5, 0.5])


def test_per_flow_cap_frees_capacity_for_the_others():
    r = max_min_rates(routes([[0], [0]]), np.array([1.0]), caps=np.array([0.2, np.inf]))
    np.testing.assert_allclose(r, [0.2, 0.8])


def test_sprayed_flow_puts_a_fraction_on_each_path():
    # f0 sprayed half/half on L0 and L1 (cap 1 each), f1 alone on L0
    r = max_min_rates(routes([[0, 1], [0]], [[0.5, 0.5], [1.0]]), np.array([1.0, 1.0]))
    # L0: 0.5 r0 + r1 <= 1 binds first at r = 2/3 for both
    np.testing.assert_allclose(r, [2 / 3, 2 / 3])


def test_bottleneck_links_names_the_saturated_link():
    rt = routes([[0, 1], [0], [1]])
    cap = np.array([1.0, 2.0])
    rate = max_min_rates(rt, cap)
    assert list(bottleneck_links(rt, cap, rate)) == [0, 1]


def test_flows_over_time_are_resolved_when_one_finishes():
    # two flows share a unit link; sizes 1 and 2: both at 1/2 until t=2, then the second alone at 1
    tl = simulate_flows(routes([[0], [0]]), np.array([1.0]), np.array([1.0, 2.0]))
    np.testing.assert_allclose(tl.finish, [2.0, 3.0])
    assert tl.solves == 2


def test_flows_over_time_with_late_start():
    tl = simulate_flows(
        routes([[0], [0]]), np.array([1.0]), np.array([1.0, 1.0]), starts=np.array([0.0, 0.5])
    )
    # f0 alone for 0.5 s (0.5 done), then both at 1/2: f0 needs 1 s more -> 1.5; f1 then alone: 1 - 0.5 = 0.5
    np.testing.assert_allclose(tl.finish, [1.5, 2.0])


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=30),
    st.integers(min_value=0, max_value=2**31 - 1),
)
def test_max_min_property(n_links, n_flows, seed):
    """Feasible, and every flow has a saturated link on which no other flow gets more (max-min)."""
    rng = np.random.default_rng(seed)
    paths = [sorted(set(rng.integers(0, n_links, size=rng.integers(1, 4)).tolist())) for _ in range(n_flows)]
    cap = rng.uniform(0.5, 5.0, size=n_links)
    rt = routes(paths)
    rate = max_min_rates(rt, cap)
    used = np.bincount(rt.link, weights=rate[rt.flow], minlength=n_links)
    assert np.all(used <= cap * (1 + 1e-9))
    for f, path in enumerate(paths):
        ok = False
        for lk in path:
            on = rt.flow[rt.link == lk]
            if used[lk] >= cap[lk] * (1 - 1e-9) and rate[f] >= rate[on].max() * (1 - 1e-9):
                ok = True
        assert ok, (f, path, rate)
