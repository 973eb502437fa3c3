"""Transfer times per step: ECMP paths are the job's for the whole run (persistent queue pairs)."""

from __future__ import annotations

import numpy as np

from fabricpace.fabric import load_cluster
from fabricpace.sim.noise import load_noise
from fabricpace.sim.transfers import TransferModel, link_names
from fabricpace.study import load_scenario


def _paper_cluster():  # type: ignore[no-untyped-def]
    """4 nodes per leaf, 4 spines, 2:1, one QP per connection: a 16-node ring crosses 4 leaves."""
    return load_cluster(load_scenario("paper").cluster)


def _times(cluster, noise, *, seed: int, nodes: int = 16, steps: int = 60) -> np.ndarray:  # type: ignore[no-untyped-def]
    model = TransferModel(
        cluster,
        nodes=nodes,
        ops_sizes=[("all_reduce", 1 << 20), ("all_reduce", 25 << 20)],
        steps=steps,
        noise=noise,
        seed=seed,
        names=link_names(cluster, nodes),
    )
    return model.times[:, model.columns([("all_reduce", 25 << 20)])[0]]


def test_ecmp_paths_are_drawn_once_per_run_not_per_step():
    cluster = _paper_cluster()
    quiet = load_noise(None)
    per_seed = [_times(cluster, quiet, seed=s) for s in range(12)]
    for t in per_seed:
        # No faults and no tenants: every step of a run sees the same paths, so the same times.
        assert np.all(t == t[0])
    # Different runs (seeds) hash their connections differently: some collide on an uplink.
    big = np.array([t[0] for t in per_seed])
    assert big.max() > 1.1 * big.min()
    assert np.unique(big).size >= 3


def test_tenant_bursts_vary_per_step_on_top_of_the_runs_paths(tmp_path):
    cluster = _paper_cluster()
    spine_links = [n for n in link_names(cluster, 16) or [] if "->spine" in n]
    noise_file = tmp_path / "n.yaml"
    bursts = "\n".join(
        f"  - {{links: [{name}], scale: 0.3, duty: 0.5, burst_steps: 3}}" for name in spine_links
    )
    noise_file.write_text(f"name: tenants\nforeign:\n{bursts}\n")
    t = _times(cluster, load_noise(noise_file), seed=3, steps=200)
    assert np.unique(t).size > 1  # tenants come and go per step
    # Steps with no burst anywhere are exactly the run's quiet paths.
    quiet = _times(cluster, load_noise(None), seed=3, steps=200)[0]
    assert t.min() >= quiet * (1 - 1e-12)
