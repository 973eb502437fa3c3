"""A healthy job the scheduler spread 2 + 2 over two leaves of a 4-per-leaf cluster is not contention:
the fabric model prices it on the run's own leaves (ranks.parquet), not packed into one leaf.

The run is simulated on a packed cluster with leaves of 2 at 2:1; diagnosed against the cluster file of
leaves of 4 at 4:1 it is the same fabric (each leaf's uplinks carry 2 nodes' NICs / 2 = 4 nodes' / 4).
Packed into one leaf of 4, the model priced its transfers x1.69 too fast and called a third of every
step topology_contention."""

from __future__ import annotations

import polars as pl
import pytest
import yaml

from fabricpace import sim
from fabricpace.diagnose import diagnose
from fabricpace.fabric import load_cluster

# gpt-1.3b's DDP reduce with one sample per GPU and 10x the compute rate: the reduce is exposed
WORKLOAD = {
    "name": "comm-heavy", "parameters": 1.3e9, "layers": 24, "grad_bytes": 2, "batch_per_gpu": 1,
    "compute": {"flops_per_sample": 1.6e13, "tflops": 1500}, "forward_fraction": 0.333,
    "optimizer_seconds": 0.004, "parallelism": {"kind": "ddp", "bucket_mb": 25, "first_bucket_mb": 1},
}


def _cluster_file(tmp_path, nodes_per_leaf: int, oversubscription: float):  # type: ignore[no-untyped-def]
    cl = load_cluster("roce-leaf-spine-2to1").model_dump(mode="json")
    cl["name"] = f"roce-{nodes_per_leaf}-per-leaf-{oversubscription:g}to1"
    cl["network"].update(nodes_per_leaf=nodes_per_leaf, spines=8, oversubscription=oversubscription)
    path = tmp_path / f"{cl['name']}.yaml"
    path.write_text(yaml.safe_dump(cl))
    return path


@pytest.fixture(scope="module")
def spread_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("uneven")
    (tmp / "w.yaml").write_text(yaml.safe_dump(WORKLOAD))
    (tmp / "n.yaml").write_text("jitter: {cv: 0.01}\n")
    run = sim.simulate(_cluster_file(tmp, 2, 2.0), tmp / "w.yaml", tmp / "n.yaml", nodes=4, steps=120, seed=1,
                       out_dir=tmp / "run")
    leaves = pl.read_parquet(run / "ranks.parquet").unique("node").sort("node")["leaf"].to_list()
    assert leaves == [0, 0, 1, 1]
    return tmp, run


def _contention(tmp, run, nodes_per_leaf, oversubscription):  # type: ignore[no-untyped-def]
    d = diagnose([run], cluster=_cluster_file(tmp, nodes_per_leaf, oversubscription))
    found = next((f for f in d.findings if f.mode == "topology_contention"), None)
    return found, d.runs[0].metrics


def test_priced_on_its_own_leaves_the_spread_job_is_not_contention(spread_run):  # type: ignore[no-untyped-def]
    found, metrics = _contention(*spread_run, 4, 4.0)
    assert found is None
    assert metrics["transfer_baseline"] == "fabric model"
    assert metrics["transfer_inflation_median"] == pytest.approx(1.0, abs=0.01)


def test_uplinks_narrower_than_the_file_says_are_still_found(spread_run):  # type: ignore[no-untyped-def]
    # the file claims 2:1 on leaves of 4 (twice the uplink the run had): its transfers are slower than
    # that fabric delivers, on the cross-leaf group
    found, metrics = _contention(*spread_run, 4, 2.0)
    assert found is not None
    assert metrics["transfer_inflation_median"] > 1.3
