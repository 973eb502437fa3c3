"""fabricpace collective through the real entry point: node counts against the cluster's size."""

from __future__ import annotations

import json

from fabricpace.fabric import load_cluster


def test_default_node_counts_stop_at_the_clusters_size(cli, tmp_path):
    # A user's own 12-node cluster file: the default 2,4,8,16,32 used to fail at 16.
    text = load_cluster("p5-efa").to_yaml().replace("nodes: 256", "nodes: 12", 1)
    path = tmp_path / "small.yaml"
    path.write_text(text)
    r = cli("collective", "--cluster", str(path), "--sizes", "1G", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert [row["nodes"] for row in json.loads(r.stdout)] == [2, 4, 8]


def test_too_many_nodes_names_the_option_and_the_limit(cli):
    r = cli("collective", "--cluster", "single-switch", "--nodes", "2,64", "--sizes", "1G")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "fabricpace: error: --nodes 2,64: cluster 'single-switch' has 32 nodes; ask for at most 32, "
        "or use a cluster file with more (docs/cluster-files.md)"
    ]
    assert r.stdout == ""
