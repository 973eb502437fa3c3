"""Audit 16 (capacity planner) findings on the fabric model and `fabricpace collective`, through the real CLI
and real files: non-finite cluster values, forced algorithms NCCL cannot run, calibration logs of
collectives the model lacks or with wrong results, sizes outside the calibrated range, --explain."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fabricpace.fabric.cluster import PRESET_DIR


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
