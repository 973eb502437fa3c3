"""Options and inputs the CLI took silently or crashed on (user audit), through the real entry point.

Before: ``collective --seed -1`` and ``ecmp_seed: -5`` were numpy tracebacks; ``study --compare
baseline,baseline`` wrote half a study and then said "nothing was written"; ``collective --nodes 4,4``
printed duplicate rows; ``simulate --steps 10 --warmup 100`` measured 2 steps; ``import nccl-tests``
refused an explicitly named ``.log.gz`` or extension-less log; the README's ``--calibrate n2.log n4.log``
was refused because the op was only in the file name; and outputs said "1 nodes", "1 leaves", "1 repeats".
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "fabric" / "data"




def test_collective_refuses_a_negative_seed(cli, refused):
    refused(cli("collective", "--nodes", "4", "--sizes", "32M", "--seed", "-1"), "--seed -1", "0 or more")


def test_a_cluster_file_with_a_negative_ecmp_seed_isrefused(cli, tmp_path, refused):
    c = tmp_path / "c.yaml"
    c.write_text("name: c\nnodes: 4\nnetwork: {ecmp_seed: -5}\n")
    refused(cli("collective", "--cluster", str(c), "--nodes", "2", "--sizes", "32M"),
             str(c), "network.ecmp_seed", "greater than or equal to 0")


def test_collective_refuses_a_node_count_given_twice(cli, refused):
    refused(cli("collective", "--nodes", "4,4", "--sizes", "32M"), "--nodes 4,4", "4 is given twice")


def test_study_refuses_a_mode_given_twice_before_writing_anything(cli, tmp_path, refused):
    out = tmp_path / "study"
    r = cli("study", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "1", "--steps",
            "10", "--warmup", "2", "--repeats", "1", "--compare", "baseline,baseline", "--out", str(out))
    refused(r, "--compare baseline,baseline", "mode baseline is given twice")
    assert not out.exists()


def test_simulate_refuses_fewer_steps_than_warmup_plus_two(cli, tmp_path, refused):
    out = tmp_path / "run"
    r = cli("simulate", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "1",
            "--steps", "10", "--warmup", "100", "--out", str(out))
    refused(r, "--steps 10 / --warmup 100", "need at least warmup + 2 steps")
    assert not out.exists()


def test_simulate_without_warmup_still_runs_a_short_run_and_counts_in_english(cli, tmp_path):
    out = tmp_path / "run"
    r = cli("simulate", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "1",
            "--steps", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert " on 1 node, 2 steps after warm-up" in r.stdout, r.stdout  # was "on 1 nodes"


def test_study_title_counts_in_english(cli, tmp_path):
    r = cli("study", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "1", "--steps",
            "6", "--warmup", "2", "--repeats", "1", "--no-figures", "--out", str(tmp_path / "s"))
    assert r.returncode == 0, r.stderr
    assert "(1 repeat, 6 steps)" in r.stdout, r.stdout


def test_place_counts_leaves_in_english(cli, tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("h0 slots=8 leaf=0\n")
    r = cli("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts))
    assert r.returncode == 0, r.stderr
    assert "1 host on 1 leaf" in r.stdout, r.stdout


@pytest.mark.parametrize("name", ["n2_all_reduce.log.gz", "n2_all_reduce", "nccl.stdout", "job.o12345"])
def test_import_reads_an_explicitly_named_log_whatever_its_name(cli, tmp_path, name):
    src = DATA / "h100ib_n2_all_reduce.log"
    log = tmp_path / name
    if name.endswith(".gz"):
        log.write_bytes(gzip.compress(src.read_bytes()))
    else:
        shutil.copy(src, log)
    out = tmp_path / "imported"
    r = cli("import", "nccl-tests", str(log), "-o", str(out), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["world_size"] == 16


def test_import_of_a_folder_still_refuses_a_stray_file(cli, tmp_path, refused):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(DATA / "h100ib_n2_all_reduce.log", logs / "n2.log")
    (logs / "notes.md").write_text("my notes\n")
    refused(cli("import", "nccl-tests", str(logs), "-o", str(tmp_path / "imported")), "mixed folder")


def test_calibrate_takes_the_op_of_a_log_that_does_not_name_it_from_op(cli, tmp_path):
    """README: ``collective --calibrate n2.log n4.log --compare n8.log``, logs without '*_perf' lines."""
    for n in (2, 4, 8):
        text = (DATA / f"h100ib_n{n}_all_reduce.log").read_text()
        (tmp_path / f"n{n}.log").write_text("".join(
            line for line in text.splitlines(keepends=True) if "_perf" not in line
        ))
    r = cli("collective", "--calibrate", "n2.log", "n4.log", "--compare", "n8.log", "--nodes", "8",
            "--sizes", "1G", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: n2.log: the log does not name its collective" in r.stderr
    assert "taken as all_reduce (--op)" in r.stderr
    assert "calibrated on 18 points" in r.stderr and "compared with 9 measured rows" in r.stderr
