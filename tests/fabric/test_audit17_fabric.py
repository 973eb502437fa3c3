"""Audit 17 findings on the fabric model, through real files and the real CLI: abridged rank lists whose
ranks all print device 0 (A2 #2), tables without rank lines (A2 #3), provenance of logs with one base name
(A2 #4), and --explain on a single spine and on sub-Gbit links (A4 #5)."""

from __future__ import annotations

import json
from pathlib import Path

# ---- A4 finding 5: a lone flow on a single spine is no ECMP collision; sub-Gbit rates are printed ------
# the fabric lab's 4-node mirror (a4-): 1 Gbit node links, one spine, 20 Mbit uplinks (oversubscription 100)
_LAB_20M = """\
name: lab-4n-2leaf-20m
nodes: 4
gpus_per_node: 1
intra_node: {kind: pcie, bandwidth_gbytes: 10.0, latency_us: 1.0}
nics: {per: node, count: 1, speed_gbps: 1.0}
network:
  topology: leaf_spine
  nodes_per_leaf: 2
  spines: 1
  oversubscription: 100.0
  routing: ecmp
  hop_latency_us: 1.0
  nic_latency_us: 20.0
tuning: {net_efficiency: 0.94, channels: 1, nvls: false}
"""


def _lab(tmp_path: Path) -> Path:
    path = tmp_path / "lab-20m.yaml"
    path.write_text(_LAB_20M)
    return path


def test_one_flow_on_the_only_spine_is_not_an_ecmp_collision(cli, tmp_path):
    r = cli("collective", "--cluster", str(_lab(tmp_path)), "--nodes", "4", "--sizes", "403240", "--explain",
            "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    # one spine: no hashing choice, so the uplink is simply the narrowest link of the path
    assert row["bottleneck"] == "leaf0->spine0" and row["bottleneck_flows"] == 1
    text = row["explain"]["text"]
    assert "collision" not in text and "1 flows" not in text and "0 Gb/s" not in text, text
    # 20 Mb/s uplink at net_efficiency 0.94
    assert "bottleneck leaf0->spine0: 1 flow alone at 18.8 Mb/s" in text, text


def test_several_flows_on_one_of_several_spines_stay_an_ecmp_collision(cli):
    r = cli("collective", "--cluster", "roce-leaf-spine-2to1", "--nodes", "32", "--sizes", "8G",
            "--algorithm", "ring", "--seed", "3", "--explain", "--format", "json")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert row["bottleneck"].endswith(" (ECMP collision)") and row["bottleneck_flows"] > 1
    assert "-- ECMP collision" in row["explain"]["text"]
    assert " Gb/s" in row["explain"]["text"]
