"""fabricpace place with the hostfiles launchers really read (Open MPI, MPICH, Slurm, plain lists)."""

from __future__ import annotations

import json

import pytest

CLUSTER = ("--cluster", "roce-leaf-spine-2to1")


def _place(cli, path, *extra):
    return cli("place", *CLUSTER, "--hosts", str(path), *extra)


def test_mpich_hostfile_is_read_and_written_back_in_its_format(cli, tmp_path):
    hosts = tmp_path / "hosts.mpich"
    hosts.write_text("a:8 leaf=0\nb:8 leaf=1\nc:8 leaf=0\nd:8 leaf=1\n")
    out = tmp_path / "placed"
    r = _place(cli, hosts, "--out", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["hosts"] == ["a", "c", "b", "d"] and d["ranks"] == 32
    assert out.read_text() == "a:8\nc:8\nb:8\nd:8\n"  # what mpiexec -f reads


def test_proposed_hostfile_keeps_tags_in_comments_and_place_reads_it_again(cli, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=8 leaf=ib-leaf-07\nb slots=8 leaf=ib-leaf-12\nc slots=8 leaf=ib-leaf-07\n"
                     "d slots=8 leaf=ib-leaf-12\n")
    first, second = tmp_path / "placed1", tmp_path / "placed2"
    r = _place(cli, hosts, "--out", str(first), "--keep-tags")
    assert r.returncode == 0, r.stderr
    assert first.read_text().splitlines()[0] == "a slots=8  # leaf=ib-leaf-07"
    r = _place(cli, first, "--out", str(second), "--keep-tags", "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["leaves_from"] == "hosts file"  # the topology survived the round trip
    assert d["cross_leaf_edges"] == {"before": 2, "after": 2}
    assert second.read_text() == first.read_text()


def test_cross_leaf_traffic_counts_ranks_not_hosts(cli, tmp_path):
    # 4 hosts x 8 slots = 32 ranks; a ring all-reduce of 1 GiB sends 2*31/32 GiB over each edge.
    # Before: a b c d on leaves 0 1 0 1 -> 4 crossings = 7.75 GiB; after: 2 crossings = 3.875 GiB.
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=8 leaf=0\nb slots=8 leaf=1\nc slots=8 leaf=0\nd slots=8 leaf=1\n")
    r = _place(cli, hosts, "--format", "json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)["cross_leaf_bytes"]
    gib = 1 << 30
    assert b["before"] == pytest.approx(4 * 2 * 31 / 32 * gib)
    assert b["after"] == pytest.approx(2 * 2 * 31 / 32 * gib)
    r = _place(cli, hosts)
    assert "7.75 GiB -> 3.88 GiB (ring of 32 ranks" in r.stdout


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("gpu-a01,gpu-a02,gpu-b01\n", [":1:", "comma-separated", "one host per line"]),
        ("gpu[01-04]\n", [":1:", "scontrol show hostnames 'gpu[01-04]'"]),
        ("a:x\n", [":1:", "HOST:N"]),
        ("a slots=0 leaf=0\nb slots=8 leaf=1\n", [":1:", "slots=0", "runs no rank"]),
        ("a:0\n", [":1:", "a:0", "runs no rank"]),
        ("a slots=8 max_slots=4\n", [":1:", "max_slots=4 is below slots=8"]),
        ("a node=0\nb node=0\nc node=1\n", [":2:", "node=0 is also on line 1"]),
        ("a slots=8\nb:8\n", [":2:", "MPICH", "one format"]),
        ("a slots=8\nb\n", [":2:", "slots=8", "every line or on none"]),
        ("a leaf=3\nb\nc leaf=3\n", [":2:", "no leaf=L or node=K here", "tag every line"]),
        ("a slots=8 slots=4\n", [":1:", "slots= is given twice"]),
        ("a node=20 leaf=0\n", [":1:", "node=20 is on leaf 1"]),
        ("a leaf=0\nb leaf=0\na leaf=1\n", [":3:", "listed twice (first on line 1)"]),
    ],
)
def test_hostfile_mistakes_are_one_line_naming_the_line(cli, refused, tmp_path, text, needles):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(text)
    refused(_place(cli, hosts), str(hosts), *needles)


def test_tags_that_contradict_the_cluster_are_refused(cli, refused, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("a leaf=0\nb leaf=1\nc leaf=0\nd leaf=1\n")
    refused(cli("place", "--cluster", "single-switch", "--hosts", str(hosts)),
            f"{hosts}:2:", "leaf=1 makes 2 leaves", "'single-switch' has one switch")
    hosts.write_text("".join(f"h{i} leaf=0\n" for i in range(17)))  # 16 nodes per leaf there
    refused(_place(cli, hosts), f"{hosts}:17:", "17 hosts on leaf 0", "16 nodes per leaf")
    hosts.write_text("".join(f"h{i} leaf={i % 2}\n" for i in range(40)))  # more hosts than nodes
    refused(cli("place", "--cluster", "single-switch", "--hosts", str(hosts)),
            f"{hosts}:33:", "host 33 of 40", "32 nodes")


def test_help_describes_the_hosts_file(cli):
    r = cli("place", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for needle in ("slots=N", "HOST:N", "scontrol show hostnames", "leaf=L", "node=K", "--keep-tags"):
        assert needle in text, needle
