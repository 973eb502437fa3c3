"""Audit 16 (capacity planner) findings on the fabric model and `fabricpace collective`, through the real CLI
and real files: non-finite cluster values, forced algorithms NCCL cannot run, calibration logs of
collectives the model lacks or with wrong results, sizes outside the calibrated range, --explain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fabricpace.fabric.cluster import PRESET_DIR
from fabricpace.fabric.nccl_tests import parse_log


def _cluster_file(tmp_path: Path, name: str, preset: str = "dgx-h100-ib", **changes: dict) -> Path:
    data = yaml.safe_load((PRESET_DIR / f"{preset}.yaml").read_text())
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---- finding 9: non-finite numbers in a cluster file ------------------------------------------------------
@pytest.mark.parametrize(
    ("section", "field", "text"),
    [("intra_node", "bandwidth_gbytes", ".inf"), ("network", "hop_latency_us", ".nan"),
     ("tuning", "base_us", ".inf")],
)
def test_non_finite_cluster_values_are_refused(cli, refused, tmp_path, section, field, text):
    path = _cluster_file(tmp_path, "c.yaml", **{section: {field: 1.0}})
    path.write_text(path.read_text().replace(f"{field}: 1.0", f"{field}: {text}"))
    r = cli("collective", "--cluster", str(path), "--nodes", "2", "--sizes", "1G")
    refused(r, str(path), f"{section}.{field}", "finite")


# ---- finding 3: forced algorithm / protocol combinations NCCL cannot run -------------------------------
@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--op", "all_to_all", "--algorithm", "ring"), ("'ring'", "all_to_all", "p2p")),
        (("--op", "broadcast", "--algorithm", "p2p"), ("'p2p'", "broadcast")),
        (("--algorithm", "p2p"), ("'p2p'", "all_reduce")),
        (("--algorithm", "nvls", "--nodes", "1", "--cluster", "PCIE"), ("'nvls'", "pcie")),
        (("--algorithm", "nvls_tree", "--cluster", "NONVLS"), ("'nvls_tree'", "tuning.nvls is false")),
        (("--algorithm", "nvls_tree", "--protocol", "LL"), ("'LL'", "'nvls_tree'", "Simple")),
        (("--algorithm", "nvls", "--nodes", "1", "--protocol", "LL128"), ("'LL128'", "'nvls'", "Simple")),
        (("--protocol", "LL128", "--cluster", "PCIE"), ("'LL128'", "pcie")),
        (("--protocol", "ll128", "--algorithm", "ring", "--cluster", "PCIE"), ("'LL128'", "pcie")),
    ],
)
def test_forced_combinations_nccl_cannot_run_are_refused(cli, refused, tmp_path, args, needles):
    pcie = _cluster_file(tmp_path, "pcie.yaml", intra_node={"kind": "pcie"})
    nonvls = _cluster_file(tmp_path, "nonvls.yaml", tuning={"nvls": False})
    args = tuple({"PCIE": str(pcie), "NONVLS": str(nonvls)}.get(a, a) for a in args)
    if "--nodes" not in args:
        args += ("--nodes", "4")
    r = cli("collective", "--sizes", "1G", "--format", "csv", *args)
    refused(r, *needles)


def test_protocol_is_case_insensitive_and_valid_combinations_still_run(cli):
    r = cli(
        "collective", "--nodes", "4", "--sizes", "1G", "--format", "csv", "--protocol", "ll128",
        "--algorithm", "RING",
    )
    assert r.returncode == 0, r.stderr
    row = r.stdout.splitlines()[1].split(",")
    assert row[4:6] == ["ring", "LL128"]
    r = cli("collective", "--nodes", "4", "--sizes", "1G", "--format", "csv", "--op", "all_to_all",
            "--algorithm", "p2p")
    assert r.returncode == 0, r.stderr


def test_help_lists_what_algorithm_accepts(cli):
    r = cli("collective", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.replace("│", " ").split())
    for needle in ("all_to_all p2p", "nvls_tree", "hierarchical", "LL|LL128|Simple", "any case"):
        assert needle in text, needle


# ---- finding 4: calibration logs of collectives the model does not have ---------------------------------
def test_calibrating_on_a_sendrecv_log_is_refused(cli, refused, data_dir, tmp_path):
    out = tmp_path / "fit.yaml"
    r = cli(
        "collective", "--calibrate", str(data_dir / "a100_n1_t2_sendrecv.log"), "--nodes", "2",
        "--sizes", "1G", "--save-calibration", str(out),
    )
    refused(r, "a100_n1_t2_sendrecv.log", "sendrecv", "all_reduce, all_gather")
    assert not out.exists()


def test_a_sendrecv_log_among_modelled_ones_is_left_out_with_a_note(cli, data_dir):
    logs = [data_dir / n for n in ("a100_n1_t2_sendrecv.log", "h100ib_n2_all_reduce.log",
                                   "h100ib_n4_all_reduce.log")]
    r = cli("collective", "--calibrate", *map(str, logs), "--nodes", "8", "--sizes", "1G", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "calibrated on 18 points from 2 logs" in r.stderr
    note = next(line for line in r.stderr.splitlines() if "sendrecv" in line)
    assert "left out a100_n1_t2_sendrecv.log" in note and "does not have" in note


# ---- finding 5: rows with a non-zero #wrong ----------------------------------------------------------------
def _with_wrong(src: Path, dst: Path, wrong: dict[int, int], trailer: int | None) -> Path:
    """``src`` (a real nccl-tests log) with the #wrong columns of the rows of ``wrong``'s sizes set, and an
    'Out of bounds values : N FAILED' trailer, the way nccl-tests prints a run with wrong results."""
    out = []
    for line in src.read_text().splitlines():
        parts = line.split()
        if len(parts) == 13 and parts[0].isdigit() and int(parts[0]) in wrong:
            parts[8] = parts[12] = str(wrong[int(parts[0])])
            line = "".join(p.rjust(w) for p, w in zip(parts, (12, 14, 10, 8, 8, 9, 8, 8, 7, 9, 8, 8, 7),
                                                       strict=True))
        if trailer is not None and line.startswith("# Avg bus bandwidth"):
            out.append(f"# Out of bounds values : {trailer} FAILED")
        out.append(line)
    dst.write_text("\n".join(out) + "\n")
    return dst


def test_rows_with_wrong_results_are_left_out_of_the_fit_with_a_note(cli, data_dir, tmp_path):
    n4 = _with_wrong(data_dir / "h100ib_n4_all_reduce.log", tmp_path / "bad_n4_all_reduce.log",
                     {1 << 30: 12, 2 << 30: 3}, 4111)
    r = cli("collective", "--calibrate", str(data_dir / "h100ib_n2_all_reduce.log"), str(n4),
            "--nodes", "8", "--sizes", "1G", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "calibrated on 16 points from 2 logs" in r.stderr  # 18 rows from 32 MiB up, 2 of them wrong
    note = next(line for line in r.stderr.splitlines() if "wrong results" in line)
    for needle in ("bad_n4_all_reduce.log", "2 rows", "1G 24", "2G 6", "Out of bounds values : 4111 FAILED",
                   "left out"):
        assert needle in note, needle


def test_compare_leaves_out_rows_with_wrong_results(cli, data_dir, tmp_path):
    n8 = _with_wrong(data_dir / "h100ib_n8_all_reduce.log", tmp_path / "bad_n8_all_reduce.log",
                     {512 << 20: 5}, 5)
    r = cli("collective", "--compare", str(n8), "--nodes", "8", "--sizes", "1G", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert "compared with 8 measured rows" in r.stderr and "1 row reports wrong results" in r.stderr


def test_a_log_whose_rows_are_all_wrong_is_refused(cli, refused, data_dir, tmp_path):
    log = parse_log(data_dir / "h100ib_n4_all_reduce.log")
    n4 = _with_wrong(data_dir / "h100ib_n4_all_reduce.log", tmp_path / "broken_n4_all_reduce.log",
                     {r.size: 1 for r in log.rows}, 700)
    r = cli("collective", "--calibrate", str(data_dir / "h100ib_n2_all_reduce.log"), str(n4),
            "--nodes", "8", "--sizes", "1G")
    refused(r, "broken_n4_all_reduce.log", "wrong results", "700 FAILED")


def test_wrong_counts_are_read_from_stdout_and_json_logs(data_dir, tmp_path):
    log = parse_log(data_dir / "gh200_n2_v2178_all_reduce.log")  # a real run: 96 + 32 wrong at 1 MiB
    assert [(r.size, r.wrong) for r in log.wrong_rows] == [(1 << 20, 128)] and log.out_of_bounds == 4
    assert not parse_log(data_dir / "h100ib_n4_all_reduce.log").wrong_rows
    # the same rows as nccl-tests' -J file writes them (src/util.cu: nwrong per block, out_of_bounds)
    results = [
        {"size": r.size, "count": r.count, "type": r.type, "redop": r.redop, "root": "    -1",
         "out_of_place": {"time": r.time_us, "alg_bw": r.algbw, "bus_bw": r.busbw,
                          "nwrong": 96 if r.wrong else 0},
         "in_place": {"time": r.inplace_time_us, "alg_bw": r.inplace_algbw, "bus_bw": r.inplace_busbw,
                      "nwrong": 32 if r.wrong else 0}}
        for r in log.rows
    ]
    devices = [{"rank": i, "group": 0, "hostname": h, "device": 0} for i, h in enumerate(log.hosts)]
    doc = {"version": 2, "args": ["./build/all_reduce_perf"], "config": {"devices": devices},
           "results": results, "out_of_bounds": {"count": 4, "okay": "false"}}
    p = tmp_path / "gh200.json"
    p.write_text(json.dumps(doc))
    js = parse_log(p)
    assert [(r.size, r.wrong) for r in js.wrong_rows] == [(1 << 20, 128)] and js.out_of_bounds == 4


# ---- finding 1: predictions outside the calibrated size range ------------------------------------------
def test_sizes_outside_the_calibrated_range_get_a_note(cli, data_dir, tmp_path):
    fit = tmp_path / "cal_ib.yaml"
    logs = [str(data_dir / f"h100ib_n{n}_all_reduce.log") for n in (2, 4)]
    r = cli("collective", "--calibrate", *logs, "--save-calibration", str(fit), "--nodes", "8",
            "--sizes", "1M,32M", "--format", "csv")
    assert r.returncode == 0, r.stderr
    note = next(line for line in r.stderr.splitlines() if "calibrated range" in line)
    assert "1M" in note and "32M.." in note and "32M," not in note
    # the saved calibration keeps its range: a later prediction from the file says so too
    r = cli("collective", "--cluster", str(fit), "--nodes", "2,8", "--sizes", "1M,2M,16G", "--format", "csv")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "calibrated range" in line]
    assert len(lines) == 1 and "1M, 2M, 16G" in lines[0] and "32M..8G" in lines[0]
    r = cli("collective", "--cluster", str(fit), "--nodes", "8", "--sizes", "32M,8G", "--format", "csv")
    assert r.returncode == 0 and "calibrated range" not in r.stderr


def test_simulate_and_study_on_a_calibrated_cluster_note_buckets_outside_its_range(cli, data_dir, tmp_path):
    """simulate/study on a calibrated cluster fed DDP's 1 MiB first bucket (and 25 MiB ones) to a fit
    made on 32 MiB-8 GiB rows without the note `collective` prints; stdout stays pure JSON."""
    fit = tmp_path / "cal_ib.yaml"
    logs = [str(data_dir / f"h100ib_n{n}_all_reduce.log") for n in (2, 4)]
    assert cli("collective", "--calibrate", *logs, "--save-calibration", str(fit), "--nodes", "8",
               "--sizes", "32M", "--format", "csv").returncode == 0
    r = cli("simulate", "--cluster", str(fit), "--workload", "resnet-50", "--nodes", "2", "--steps", "30",
            "--out", str(tmp_path / "sim"), "--format", "json")
    assert r.returncode == 0, r.stderr
    json.loads(r.stdout)
    note = next(line for line in r.stderr.splitlines() if "calibrated range" in line)
    assert "gradient bucket size(s) 1 MiB" in note and "32M..8G" in note, note
    r = cli("study", "--cluster", str(fit), "--workload", "resnet-50", "--nodes", "2", "--repeats", "1",
            "--steps", "30", "--warmup", "5", "--no-figures", "--out", str(tmp_path / "study"))
    assert r.returncode == 0 and "gradient bucket size(s) 1 MiB" in r.stderr, r.stderr
    r = cli("simulate", "--cluster", "dgx-h100-ib", "--workload", "resnet-50", "--nodes", "2",
            "--steps", "30", "--out", str(tmp_path / "sim2"))
    assert r.returncode == 0 and "calibrated range" not in r.stderr  # a preset is not calibrated


# ---- finding 7: --explain ------------------------------------------------------------------------------
def _os2(tmp_path: Path) -> Path:
    """The roce-leaf-spine-2to1 preset cut to 64 nodes (4 leaves of 16), plain ECMP, as the audit used."""
    return _cluster_file(tmp_path, "os2.yaml", preset="roce-leaf-spine-2to1", network={"nodes_per_leaf": 16})


def _json_row(cli, *args: str) -> dict:
    r = cli("collective", *args, "--explain", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def test_explain_all_to_all_names_the_bottleneck_link_and_its_flows(cli, tmp_path):
    row = _json_row(cli, "--cluster", str(_os2(tmp_path)), "--op", "all_to_all", "--nodes", "64",
                    "--sizes", "1G")
    first = row["explain"]["links"][0]
    assert row["bottleneck"] == first["link"] and "spine" in first["link"]
    assert row["bottleneck_flows"] == first["flows"] > 0
    assert "no flows" not in row["explain"]["text"] and first["link"] in row["explain"]["text"]


@pytest.mark.parametrize("seed", ["0", "3"])
def test_row_and_explain_name_the_same_link_and_flows(cli, tmp_path, seed):
    """Seed 3 draws an ECMP collision (three flows on one spine uplink); seed 0 none, where every NIC port
    carries the same two flows (a tie)."""
    row = _json_row(cli, "--cluster", str(_os2(tmp_path)), "--nodes", "32", "--sizes", "8G", "--seed", seed)
    first = row["explain"]["links"][0]
    assert row["bottleneck"].removesuffix(" (ECMP collision)") == first["link"]
    assert row["bottleneck_flows"] == first["flows"] and row["bottleneck_flows"] >= 2
    if seed == "3":
        assert "ECMP collision" in row["bottleneck"] and "spine" in first["link"]


def test_row_counts_queue_pairs_as_explain_does(cli, tmp_path):
    """(review of audit 16, L4) With 4 queue pairs per connection the row said 2 flows on a NIC port
    while --explain said 8 on the same link: both now count queue pairs."""
    path = _cluster_file(tmp_path, "q4.yaml", preset="roce-leaf-spine-2to1",
                         network={"qps_per_connection": 4})
    row = _json_row(cli, "--cluster", str(path), "--nodes", "16", "--sizes", "1G")
    first = row["explain"]["links"][0]
    assert row["bottleneck"] == first["link"] and row["bottleneck_flows"] == first["flows"] == 8, row


def test_explain_with_csv_goes_to_stderr(cli, tmp_path):
    r = cli("collective", "--cluster", str(_os2(tmp_path)), "--nodes", "32", "--sizes", "8G", "--seed", "3",
            "--explain", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("op,nodes") and "bottleneck leaf" not in r.stdout
    assert "bottleneck leaf0->spine11" in r.stderr and "flows share" in r.stderr


# ---- finding 2: the documented sensitivity of tree latency to hop_latency_us ----------------------------
def test_tree_latency_moves_by_the_documented_multiple_of_the_switch_latency(tmp_path):
    """docs/cluster-files.md: a (NVLS-)tree level costs (nic + switches x hop) x 50/9.6 with Simple, twice
    per level: 0.3 us more per switch adds 2 x levels x switches x 0.3 x 50/9.6 (16 nodes: one leaf, 4 levels;
    17 nodes: two leaves, 3 switches, 5 levels)."""
    from fabricpace.fabric import collective_time, load_cluster

    base = load_cluster("roce-leaf-spine-2to1").model_copy(deep=True)
    lat = {}
    for hop in (0.3, 0.6):
        net = base.network.model_copy(update={"hop_latency_us": hop, "nic_latency_us": 2.0,
                                              "oversubscription": 1.0})
        cl = base.model_copy(update={"network": net})
        for nodes in (16, 17):
            r = collective_time(cl, "all_reduce", 25 << 20, nodes=nodes)
            assert (r.algorithm, r.protocol) == ("nvls_tree", "Simple")
            lat[hop, nodes] = r.latency_s * 1e6
    for nodes, levels, switches in ((16, 4, 1), (17, 5, 3)):
        step = 2 * levels * switches * 0.3 * 50 / 9.6
        assert lat[0.6, nodes] - lat[0.3, nodes] == pytest.approx(step, rel=1e-9)
