"""Benchmark: one max-min fair solve of 10,000 flows on a 1,024-node leaf-spine (target < 0.5 s).

Flows: random node pairs on random rails of the `roce-leaf-spine-2to1` preset grown to 1,024 nodes
(8 NICs per node, 16 nodes per leaf, 64 spines, 2:1 oversubscribed), each hashed by ECMP onto one spine.
Prints the median and spread of repeated solves and flows per second; also times the closed-form
bincount path the simulator uses for one ECMP draw of a 1,024-node ring all-reduce.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from fabricpace.fabric import load_cluster, sample_collective_times
from fabricpace.fabric.maxmin import max_min_rates
from fabricpace.fabric.topology import Topology

N_NODES, N_FLOWS, REPEATS = 1024, 10_000, 7


def main() -> None:
    # No options: --help prints what it measures instead of running it.
    fmt = argparse.RawDescriptionHelpFormatter
    argparse.ArgumentParser(description=__doc__, formatter_class=fmt).parse_args()
    cluster = load_cluster("roce-leaf-spine-2to1").model_copy(update={"nodes": N_NODES})
    topo = Topology.build(cluster, N_NODES)
    rng = np.random.default_rng(0)
    src = rng.integers(0, N_NODES, N_FLOWS)
    dst = (src + rng.integers(1, N_NODES, N_FLOWS)) % N_NODES
    nic = rng.integers(0, cluster.nics.count, N_FLOWS)
    routes = topo.route(src, nic, dst, nic, rng.integers(0, topo.spines, N_FLOWS))
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        rate = max_min_rates(routes, topo.capacity)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(
        f"max-min solve: {N_FLOWS} flows, {routes.link.size} flow-link entries, {topo.n_links} links, "
        f"{N_NODES} nodes leaf-spine"
    )
    print(
        f"  median {med * 1e3:.1f} ms (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}, n={REPEATS})"
        f" -> {N_FLOWS / med:,.0f} flows/s; target < 500 ms: {'met' if med < 0.5 else 'MISSED'}"
    )
    print(f"  rates: min {rate.min() * 8 / 1e9:.1f} Gb/s, median {np.median(rate) * 8 / 1e9:.1f} Gb/s")

    draws = 1000
    t0 = time.perf_counter()
    sample_collective_times(
        cluster, "all_reduce", 25 << 20, nodes=N_NODES, n=draws, rng=np.random.default_rng(1)
    )
    dt = time.perf_counter() - t0
    print(
        f"sample_collective_times: {draws} ECMP draws of a 1,024-node all-reduce in {dt * 1e3:.0f} ms "
        f"({draws / dt:,.0f} draws/s, closed form, no max-min solve per draw)"
    )


if __name__ == "__main__":
    main()
