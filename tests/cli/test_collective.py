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


def test_calibrate_glob_form_equals_the_repeated_form(cli):
    # `--calibrate logs/*.log` reaches the program as `--calibrate n2.log n4.log`: one fit on both.
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "fabric" / "data"
    a, b = str(data / "h100ib_n2_all_reduce.log"), str(data / "h100ib_n4_all_reduce.log")
    common = ("collective", "--nodes", "8", "--sizes", "1G", "--format", "json")
    glob = cli(*common, "--calibrate", a, b)
    repeated = cli(*common, "--calibrate", a, "--calibrate", b)
    assert glob.returncode == 0 and repeated.returncode == 0, glob.stderr
    assert json.loads(glob.stdout) == json.loads(repeated.stdout)
    assert "from 2 logs" in glob.stderr
    stray = cli(*common, a)  # a log without --calibrate is still a mistake
    assert stray.returncode == 2 and "unexpected argument(s)" in stray.stderr


def test_calibrating_on_another_collective_gets_a_note(cli):
    from pathlib import Path

    log = str(Path(__file__).resolve().parents[1] / "fabric" / "data" / "h100ib_n2_all_reduce.log")
    r = cli("collective", "--op", "all_gather", "--nodes", "8", "--sizes", "1G", "--calibrate", log)
    assert r.returncode == 0, r.stderr
    assert "calibrated on all_reduce logs but predicting all_gather" in r.stderr
    same = cli("collective", "--op", "all_reduce", "--nodes", "8", "--sizes", "1G", "--calibrate", log)
    assert "but predicting" not in same.stderr
