"""fabricpace place with hosts files written the way users write them (the real entry point)."""

from __future__ import annotations

import json


def test_hosts_without_leaf_or_node_say_what_was_assumed(cli, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# DeepSpeed\ngpu-a01 slots=8\ngpu-b07 slots=8\ngpu-a02 slots=8\ngpu-b08 slots=8\n")
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts))
    assert r.returncode == 0, r.stderr
    assert "no host says node=K or leaf=L" in r.stdout
    # Nothing was found to be optimal: the command was told nothing about the topology.
    assert "already optimal" not in r.stdout
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--format", "json")
    assert json.loads(r.stdout)["leaves_from"] == "line positions"


def test_open_mpi_max_slots_is_read_and_kept(cli, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=8 max_slots=8 leaf=1\nb slots=8 max_slots=8 leaf=0\nc slots=8 leaf=1\n")
    out = tmp_path / "placed"
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--out", str(out),
            "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["leaves_from"] == "hosts file"
    assert d["cross_leaf_edges"] == {"before": 2, "after": 2}  # 3 hosts on 2 leaves: 2 crossings already
    assert out.read_text() == "a slots=8 max_slots=8\nb slots=8 max_slots=8\nc slots=8\n"


def test_long_lines_are_not_wrapped_inside_a_number(cli, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a leaf=0\nb leaf=1\nc leaf=0\nd leaf=1\n")
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--bytes", "5G")
    assert r.returncode == 0, r.stderr
    # No slots: the cluster's 8 GPUs per host, a ring of 32 ranks, 2 x 31/32 x 5 GiB per crossing.
    assert "per all-reduce of 5.00 GiB: 38.75 GiB -> 19.38 GiB (ring of 32 ranks" in r.stdout
    assert "8 ranks per host, the cluster's gpus_per_node" in r.stdout


def test_leaves_can_be_switch_names(cli, tmp_path):
    # What a user copies from the fabric manager or SLURM topology.conf: switch names, not numbers.
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a slots=8 leaf=ib-leaf-07\nb slots=8 leaf=ib-leaf-12\nc slots=8 leaf=ib-leaf-07\n"
                     "d slots=8 leaf=ib-leaf-12\n")
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["hosts"] == ["a", "c", "b", "d"] and d["leaves"] == ["ib-leaf-07"] * 2 + ["ib-leaf-12"] * 2
    assert d["cross_leaf_edges"] == {"before": 4, "after": 2}
    hosts.write_text("a leaf=\n")
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts))
    assert r.returncode == 2 and "cannot read 'leaf='" in r.stderr
