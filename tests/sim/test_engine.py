"""The iteration engine against hand computation, order statistics and its own determinism."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from fabricpace.fabric import collective_time, load_cluster
from fabricpace.run import load_run
from fabricpace.sim import load_workload, simulate
from fabricpace.study.metrics import step_table


def test_noise_free_step_equals_compute_plus_exposed_comm(tmp_path, small_workload):
    cluster = load_cluster("single-switch")  # non-blocking: no ECMP variation
    nodes = 2
    run = load_run(
        simulate(cluster, small_workload, None, nodes=nodes, steps=5, seed=0, out_dir=tmp_path / "r")
    )
    w = load_workload(small_workload)
    sizes = w.buckets()
    fwd, bwd, opt = 0.1 / 3, 0.1 - 0.1 / 3, 0.01
    # By hand: buckets ready in order during backward, one stream, each starts when ready and free.
    t_free, frac = 0.0, np.cumsum(sizes) / sizes.sum()
    for j, size in enumerate(sizes):
        ready = fwd + bwd * frac[j]
        t = collective_time(cluster, "all_reduce", int(size), nodes=nodes).time_s
        t_free = max(ready, t_free) + t
    expected_first = t_free + opt  # step 0 starts at 0 on every rank
    steps = run.steps.sort(["step", "rank"])
    first = steps.filter(pl.col("step") == 0)
    assert np.allclose(first["t_end_ns"].to_numpy() / 1e9, expected_first, atol=2e-9)
    # Later steps start after the previous optimizer: same duration, so each takes expected_first.
    later = steps.filter(pl.col("step") >= 1)
    dur = (later["t_end_ns"] - later["t_start_ns"]).to_numpy() / 1e9
    assert np.allclose(dur, expected_first, atol=2e-9)
    exposed = t_free - (fwd + bwd)
    assert np.allclose(later["wait_ns"].to_numpy() / 1e9, exposed, atol=2e-9)
    assert np.allclose(later["compute_ns"].to_numpy() / 1e9, fwd + bwd + opt, atol=2e-9)
    assert (later["samples"] == 16).all()


def _max_normal_mc(n: int, cv: float, rng: np.random.Generator) -> float:
    return float(np.maximum(1 + cv * rng.standard_normal((200_000, n)), 0.05).max(axis=1).mean())


def test_iid_jitter_grows_like_expected_maximum(tmp_path, write_yaml):
    # Tiny gradients: communication is latency only, so the step is max_r(compute_r) + comm.
    wl = write_yaml(
        tmp_path / "w.yaml",
        {"name": "t", "parameters": 1e4, "batch_per_gpu": 1, "compute": {"seconds": 0.1}},
    )
    nz = write_yaml(tmp_path / "n.yaml", {"jitter": {"cv": 0.05}})
    cluster = load_cluster("single-switch")
    rng = np.random.default_rng(5)
    means = {}
    for nodes in (1, 4, 16):
        run = load_run(
            simulate(cluster, wl, nz, nodes=nodes, steps=300, seed=3, out_dir=tmp_path / f"r{nodes}")
        )
        it = step_table(run, 1)["iter_s"].to_numpy()
        comm = collective_time(cluster, "all_reduce", 40_000, nodes=nodes).time_s
        measured = it.mean() - comm
        expected = 0.1 * _max_normal_mc(nodes * 8, 0.05, rng)
        means[nodes] = measured
        # within 0.6% of the Monte-Carlo of the maximum (sampling error of 300 steps is ~0.1%)
        assert measured == pytest.approx(expected, rel=6e-3), nodes
    assert means[1] < means[4] < means[16]


def test_persistent_slow_rank_arrives_last(tmp_path, small_workload, write_yaml):
    nz = write_yaml(
        tmp_path / "n.yaml",
        {"jitter": {"cv": 0.02}, "slow": [{"rank": 5, "factor": 1.1, "reason": "far NUMA NIC"}]},
    )
    run = load_run(
        simulate("single-switch", small_workload, nz, nodes=2, steps=60, seed=1, out_dir=tmp_path / "r")
    )
    c = run.collectives
    last = c.sort("t_enter_ns").group_by(["step", "seq"]).agg(pl.col("rank").last())
    share = float((last["rank"] == 5).mean())
    assert share >= 0.9


def _tables(path):
    return {
        name: pq.read_table(next((path / name / "all").glob("part-*.parquet")))
        for name in ("steps", "collectives")
    }


def test_same_seed_same_run_bit_for_bit(tmp_path, small_workload, write_yaml):
    nz = write_yaml(
        tmp_path / "n.yaml",
        {
            "jitter": {"cv": 0.03, "distribution": "lognormal"},
            "gc": {
                "garbage_mb_per_step": 20,
                "threshold_mb": 200,
                "pause_ms_base": 5,
                "pause_ms_per_mb": 0.2,
            },
            "pauses": {"rate_hz": 2.0, "duration_ms": 3},
        },
    )
    runs = [
        simulate("roce-leaf-spine-2to1", small_workload, nz, nodes=2, steps=30, seed=s, out_dir=tmp_path / d)
        for s, d in ((7, "a"), (7, "b"), (8, "c"))
    ]
    a, b, c = (_tables(p) for p in runs)
    for name in ("steps", "collectives"):
        assert a[name].equals(b[name]), name
    assert not a["steps"].equals(c["steps"])
    assert load_run(runs[0]).manifest.run_id == load_run(runs[1]).manifest.run_id


def _transfer(run, lo, hi):
    c = run.collectives.filter(pl.col("step").is_between(lo, hi - 1))
    per = c.group_by(["step", "seq"]).agg(
        (pl.col("t_exit_ns").min() - pl.col("t_enter_ns").max()).alias("transfer")
    )
    return float(per["transfer"].mean())


def test_congested_link_inflates_transfer_only_on_collectives_crossing_it(
    tmp_path, small_workload, leaf_cluster, write_yaml
):
    nz = write_yaml(
        tmp_path / "n.yaml",
        {
            "foreign": [
                {"links": ["leaf0->spine0", "leaf0->spine1"], "scale": 0.25, "from_step": 10, "to_step": 20}
            ]
        },
    )
    # 4 nodes span two leaves: the all-reduce crosses leaf0's uplinks.
    crossing = load_run(
        simulate(leaf_cluster, small_workload, nz, nodes=4, steps=30, seed=1, out_dir=tmp_path / "x")
    )
    quiet, busy = _transfer(crossing, 0, 10), _transfer(crossing, 10, 20)
    assert busy > 1.5 * quiet
    assert _transfer(crossing, 20, 30) == pytest.approx(quiet, rel=0.05)
    # 2 nodes on leaf0 only: no collective crosses the spine, so the same fault changes nothing.
    local = load_run(
        simulate(leaf_cluster, small_workload, nz, nodes=2, steps=30, seed=1, out_dir=tmp_path / "y")
    )
    assert _transfer(local, 10, 20) == pytest.approx(_transfer(local, 0, 10), rel=1e-6)


def test_flapping_link_and_slow_node(tmp_path, small_workload, leaf_cluster, write_yaml):
    nz = write_yaml(
        tmp_path / "n.yaml",
        {
            "links": [{"link": "leaf1->spine0", "scale": 0.2, "flap_period_steps": 10, "flap_down_steps": 3}],
            "slow": [{"node": 1, "factor": 1.2}],
        },
    )
    run = load_run(
        simulate(leaf_cluster, small_workload, nz, nodes=4, steps=40, seed=2, out_dir=tmp_path / "r")
    )
    comp = run.steps.group_by("rank").agg(pl.col("compute_ns").median()).sort("rank")["compute_ns"].to_numpy()
    node = run.ranks.sort("rank")["node"].to_numpy()
    assert np.all(comp[node == 1] > 1.15 * np.median(comp[node != 1]))
    assert run.ranks.sort("rank")["leaf"].to_list() == [0, 0, 0, 0, 1, 1, 1, 1]


def test_fsdp_workload_records_gathers_and_reduce_scatters(tmp_path, write_yaml):
    wl = write_yaml(
        tmp_path / "f.yaml",
        {"preset": "gpt-7b", "name": "f", "layers": 4, "compute": {"seconds": 0.2}},
    )
    run = load_run(simulate("dgx-h100-ib", wl, None, nodes=2, steps=4, seed=0, out_dir=tmp_path / "r"))
    ops = set(run.collectives["op"].unique().to_list())
    assert ops == {"all_gather", "reduce_scatter"}
    assert run.collectives.filter(pl.col("step") == 0).height == 16 * 12  # ranks x 3 per layer
    dur = (run.steps["t_end_ns"] - run.steps["t_start_ns"]).to_numpy() / 1e9
    assert np.all(dur > 0.2)  # compute plus exposed gathers


def test_collectives_table_can_be_left_out_and_window_blocks_match(tmp_path, small_workload, write_yaml):
    from fabricpace.sim import SimOptions

    a = simulate(
        "single-switch",
        small_workload,
        None,
        nodes=1,
        steps=12,
        seed=0,
        out_dir=tmp_path / "a",
        options=SimOptions(window=5, block_elements=1),
    )
    b = simulate(
        "single-switch",
        small_workload,
        None,
        nodes=1,
        steps=12,
        seed=0,
        out_dir=tmp_path / "b",
        options=SimOptions(window=50, record_collectives=False),
    )
    ra, rb = load_run(a), load_run(b)
    assert rb.collectives.height == 0 and ra.collectives.height == 12 * 8 * len(
        load_workload(small_workload).buckets()
    )
    cols = ["rank", "step", "t_start_ns", "t_end_ns", "wait_ns"]
    assert ra.steps.sort(["step", "rank"]).select(cols).equals(rb.steps.sort(["step", "rank"]).select(cols))


def test_the_whole_clusters_links_are_named_only_for_a_fault_outside_the_job(
    tmp_path, small_workload, write_yaml, monkeypatch
):
    """A cluster file can describe 10^6 nodes; naming all its links took 1.7 GB and 10 s (session 8),
    for every simulate and, since the study checks each node count first, once more per node count.
    A fault on a link the job uses needs only the job's links; one on another leaf's uplink still
    needs the cluster's (to tell it from a typo) and is listed as outside the job."""
    import fabricpace.sim.loop as loop

    cluster = write_yaml(
        tmp_path / "big.yaml",
        {
            "name": "big",
            "nodes": 1_000_000,
            "gpus_per_node": 2,
            "nics": {"per": "gpu", "count": 2, "speed_gbps": 100},
            "network": {"topology": "leaf_spine", "nodes_per_leaf": 2, "spines": 2},
        },
    )
    sizes: list[int] = []
    real = loop.link_names

    def spy(cl, nodes):
        sizes.append(nodes)
        return real(cl, nodes) if nodes < 1000 else [*real(cl, 8), "leaf9->spine0"]

    monkeypatch.setattr(loop, "link_names", spy)
    inside = write_yaml(tmp_path / "in.yaml", {"links": [{"link": "leaf0->spine0", "scale": 0.5}]})
    simulate(cluster, small_workload, inside, nodes=4, steps=4, seed=0, out_dir=tmp_path / "a")
    assert max(sizes) == 4
    sizes.clear()
    outside = write_yaml(tmp_path / "out.yaml", {"links": [{"link": "leaf9->spine0", "scale": 0.5}]})
    run = load_run(
        simulate(cluster, small_workload, outside, nodes=4, steps=4, seed=0, out_dir=tmp_path / "b")
    )
    assert max(sizes) == 1_000_000  # (the spy answers for the big cluster without building it)
    assert "leaf9->spine0" in " ".join(run.manifest.extra["faults_outside_job"])
