"""Audit 17 findings on the fabric model, through real files and the real CLI: abridged rank lists whose
ranks all print device 0 (A2 #2), tables without rank lines (A2 #3), provenance of logs with one base name
(A2 #4), and --explain on a single spine and on sub-Gbit links (A4 #5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabricpace._errors import ParseError

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


# ---- A2 finding 2: an abridged rank list whose ranks all print device 0 ---------------------------------
DATA = Path(__file__).parent / "data"
# 4 nodes x 4 GH200, every rank "device  0" (per-rank CUDA_VISIBLE_DEVICES)
ALPS = DATA / "alps_n4_all_reduce.out"


def _abridged(tmp_path: Path, name: str, drop: range = range(4, 12)) -> Path:
    """The real Alps log with the rank lines of ``drop`` replaced by one '#  ...' line, as a pasted log is."""
    out, marked = [], False
    for line in ALPS.read_text().splitlines(keepends=True):
        if any(f"#  Rank {r:2d} " in line for r in drop):
            if not marked:
                out.append(" 0: #  ...\n")
                marked = True
            continue
        out.append(line)
    path = tmp_path / name
    path.write_text("".join(out))
    return path


def test_complete_alps_list_counts_its_hosts():
    from fabricpace.fabric.nccl_tests import parse_log

    log = parse_log(ALPS)
    assert (log.nranks, log.nodes, log.gpus_per_node, log.assumed) == (16, 4, 4, None)


def test_abridged_device0_list_is_refused_when_nothing_tells_gpus_per_node(tmp_path):
    """Read as 16 nodes of 1 GPU before (GPUs per node = highest device index + 1 = 1)."""
    from fabricpace.fabric.nccl_tests import parse_log

    with pytest.raises(ParseError) as exc:
        parse_log(_abridged(tmp_path, "job-16.out"))
    msg = str(exc.value)
    assert "device indices are all 0" in msg and "4 or 8 GPUs per node fit" in msg, msg
    assert "--gpus-per-node" in msg and "n4_all_reduce.log" in msg and "\n" not in msg


def test_abridged_device0_list_takes_gpus_per_node_from_the_name_or_the_hint(tmp_path):
    from fabricpace.fabric.nccl_tests import parse_log
    from fabricpace.fabric.nccl_tests_layout import LayoutHint

    by_name = parse_log(_abridged(tmp_path, "alps_n4_all_reduce.out"))
    assert (by_name.nodes, by_name.gpus_per_node) == (4, 4)
    assert "from the file name's 4 nodes" in by_name.notes()[0]
    by_hint = parse_log(_abridged(tmp_path, "job-16.out"), hint=LayoutHint(gpus_per_node=4, source="--x"))
    assert (by_hint.nodes, by_hint.gpus_per_node) == (4, 4)
    assert "4 GPUs per node from --x, so 4 nodes" in by_hint.notes()[0]
    # a hint that the listed hosts rule out (16 per node: two hosts would share one node) is not taken
    with pytest.raises(ParseError, match="16 from --x does not fit"):
        parse_log(_abridged(tmp_path, "job-16.out"), hint=LayoutHint(gpus_per_node=16, source="--x"))


def test_abridged_device0_list_with_a_whole_host_in_view_needs_no_hint(tmp_path):
    from fabricpace.fabric.nccl_tests import parse_log

    # ranks 0-3 on one host, 4-7 on the next: only 4 per node fits
    log = parse_log(_abridged(tmp_path, "job-16.out", drop=range(8, 12)))
    assert (log.nodes, log.gpus_per_node, log.assumed) == (4, 4, None)


def test_collective_compare_reads_an_abridged_device0_log_with_gpus_per_node(cli, tmp_path):
    path = _abridged(tmp_path, "job-16.out")
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--nodes", "4", "--sizes", "1G",
            "--gpus-per-node", "4", "--compare", str(path))
    assert r.returncode == 0, r.stderr
    assert "4 GPUs per node from --gpus-per-node, so 4 nodes" in r.stderr
    assert "on 4 nodes)" in r.stderr and "on 16 nodes" not in r.stderr, r.stderr


def test_the_default_cluster_does_not_settle_an_abridged_device0_log(cli, refused, tmp_path):
    """Review of audit 17: without --cluster, the default dgx-h100-ib's 8 GPUs per node settled the 4 x 4
    Alps log as 2 nodes x 8; only --gpus-per-node or a cluster the user names may settle it."""
    path = _abridged(tmp_path, "job-16.out")
    r = cli("collective", "--nodes", "4", "--sizes", "1G", "--compare", str(path))
    refused(r, "job-16.out", "4 or 8 GPUs per node fit", "--gpus-per-node", "--cluster FILE")
    # the same preset named on the command line is the user's word: it settles the log, with a note
    r = cli("collective", "--cluster", "dgx-h100-ib", "--nodes", "2", "--sizes", "1G", "--compare", str(path))
    assert r.returncode == 0, r.stderr
    assert "8 GPUs per node from the cluster file ('dgx-h100-ib'" in r.stderr and "so 2 nodes" in r.stderr
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--nodes", "4", "--sizes", "1G", "--compare",
            str(path))
    assert r.returncode == 0, r.stderr
    assert "4 GPUs per node from the cluster file ('alps-gh200-a2'" in r.stderr and "so 4 nodes" in r.stderr


# ---- A2 finding 3: a table without rank lines, its node count in the file name -------------------------
# the Alps campaign's own tables (parse_output.sh: the column header and rows, no rank lines), 2 and 4 nodes
TABLES = [DATA / "alpscfg2_n2_all_reduce.txt", DATA / "alpscfg2_n4_all_reduce.txt"]


def test_rankless_tables_calibrate_with_gpus_per_node_given(cli):
    """Refused before ('no rank lines, so the node count is unknown') although the names give it."""
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--gpus-per-node", "4", "--calibrate",
            *map(str, TABLES), "--nodes", "8", "--sizes", "1G", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "calibrated on 16 points from 2 logs" in r.stderr
    for n in (2, 4):
        note = f"note: alpscfg2_n{n}_all_reduce.txt: no '#  Rank' lines: {n} nodes from the file name"
        assert note + ", 4 GPUs per node from --gpus-per-node" in r.stderr
    assert json.loads(r.stdout)[0]["gpus"] == 32


def test_rankless_tables_take_gpus_per_node_from_the_cluster_file_with_a_note(cli):
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--calibrate", *map(str, TABLES), "--nodes",
            "8", "--sizes", "1G", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "4 GPUs per node from the cluster file ('alps-gh200-a2'; give --gpus-per-node" in r.stderr


def test_rankless_table_without_a_node_count_names_what_is_missing(cli, refused, tmp_path):
    bare = tmp_path / "job-152285_all_reduce.txt"  # a Slurm job id, no count (the campaign's own name,
    # job-n-00008-N-0002.txt, now gives both: tests/fabric/test_validation_alps.py)
    bare.write_bytes(TABLES[0].read_bytes())
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--gpus-per-node", "4", "--calibrate",
            str(bare), "--nodes", "8", "--sizes", "1G")
    refused(r, "no node count in the file name", "name the file after its node count (n4_all_reduce.log)")


def test_points_from_a_rankless_table_without_a_hint_say_gpus_per_node_are_missing():
    from fabricpace.fabric.calibrate import points_from_logs
    from fabricpace.fabric.nccl_tests import parse_log

    log = parse_log(TABLES[0])
    assert (log.nodes, log.gpus_per_node) == (2, None)
    with pytest.raises(ParseError, match="2 nodes from the file name, but GPUs per node are unknown"):
        points_from_logs([log])


def test_compare_with_a_rankless_table_says_what_it_assumed(cli):
    r = cli("collective", "--cluster", str(DATA / "alps.yaml"), "--gpus-per-node", "4", "--nodes", "4",
            "--sizes", "1G", "--compare", str(TABLES[1]))
    assert r.returncode == 0, r.stderr
    assert "no '#  Rank' lines: 4 nodes from the file name, 4 GPUs per node from --gpus-per-node" in r.stderr
    assert "compared with 8 measured rows" in r.stderr


# ---- A2 finding 4: provenance of logs that share one base name (per-job folders) -----------------------
def _job_folders(tmp_path: Path) -> list[str]:
    """ALCF's layout: every run's log is 'all_reduce_output.dat.5' inside its own 'nN.g4.<date>' folder."""
    out = []
    for n, folder in ((2, "n2.g4.2024-04-29-18-41-24"), (8, "n8.g4.2024-04-29-18-14-00")):
        path = tmp_path / "results" / folder / "all_reduce_output.dat.5"
        path.parent.mkdir(parents=True)
        path.write_bytes((DATA / f"polaris_n{n}_all_reduce.log").read_bytes())
        out.append(str(path))
    return out


def test_fit_source_names_the_job_folders_of_logs_with_one_base_name(cli, tmp_path):
    """The source was 'fit:all_reduce_output.dat.5,all_reduce_output.dat.5' (base names only)."""
    saved = tmp_path / "fit.yaml"
    r = cli("collective", "--cluster", str(DATA / "polaris.yaml"), "--calibrate", *_job_folders(tmp_path),
            "--nodes", "16", "--sizes", "1G", "--save-calibration", str(saved))
    assert r.returncode == 0, r.stderr
    source = ("fit:n2.g4.2024-04-29-18-41-24/all_reduce_output.dat.5,"
              "n8.g4.2024-04-29-18-14-00/all_reduce_output.dat.5")
    assert f"source: {source}" in saved.read_text()
    assert "n2.g4.2024-04-29-18-41-24/all_reduce_output.dat.5" in " ".join(r.stdout.split())  # the title


def test_shown_names_are_the_shortest_suffixes_that_tell_files_apart():
    from fabricpace.fabric.nccl_tests_runs import shown_names

    assert shown_names(["a/x/run.log", "b/x/run.log", "c/n4.log"]) == {
        "a/x/run.log": "a/x/run.log", "b/x/run.log": "b/x/run.log", "c/n4.log": "n4.log"
    }
    assert shown_names(["run.log", "/abs/run.log"]) == {"run.log": "run.log", "/abs/run.log": "abs/run.log"}
    twice = shown_names(["j1/a.dat", "j2/a.dat", "j2/a.dat"])  # one file given twice: one name
    assert twice == {"j1/a.dat": "j1/a.dat", "j2/a.dat": "j2/a.dat"}
