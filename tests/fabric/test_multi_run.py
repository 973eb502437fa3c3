"""Files that hold several complete nccl-tests runs: one log per run, as if the user had split the file.

Built from the real sweep output ``data/h100xx_n10_g1_multi_run.log`` (xxrjun/nccl-tests-cluster, see
``data/README.md``: all_reduce_perf then all_gather_perf, 10 nodes x 1 H100, nccl-tests 2.17.8, lines 1-75)
and the real -g 8 log for the no-MPI=1 case. Before (session 10), every one of these files was refused with
'a second nccl-tests run starts here ... split the log at line N'.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from fabricpace._errors import ParseError
from fabricpace.fabric import load_cluster
from fabricpace.fabric.calibrate import calibrate_cluster
from fabricpace.fabric.nccl_tests import NcclTestsLog, parse_log
from fabricpace.fabric.nccl_tests_runs import parse_logs
from fabricpace.importers.nccl_tests import import_nccl_tests
from fabricpace.run import load_run

DATA = Path(__file__).parent / "data"
REAL = DATA / "h100xx_n10_g1_multi_run.log"
LINES = REAL.read_text().splitlines(keepends=True)
RUN1, RUN2 = "".join(LINES[:35]), "".join(LINES[35:])  # split where the old refusal said (line 36)


def same(a: NcclTestsLog, b: NcclTestsLog) -> bool:
    """Every field equal but the file it came from and the run index."""
    return replace(a, path="", run=None) == replace(b, path="", run=None)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def slower(text: str, factor: float) -> str:
    """A repeated measurement: every out-of-place time of the table ``factor`` times longer."""

    def row(m: re.Match[str]) -> str:
        f = m.group(0).split()
        f[5] = f"{float(f[5]) * factor:.2f}"
        return "  ".join(f)

    return re.sub(r"^\s+\d+\s+\d+\s+double\s.*$", row, text, flags=re.M)


def test_real_file_reads_as_the_two_files_the_old_message_split_it_into(tmp_path):
    """The old refusal's own head/tail commands, run in a shell, make two files; parse_logs on the whole
    file gives exactly their two logs, and names each run by its lines in the original file."""
    with pytest.raises(ParseError) as err:  # parse_log still reads one run and says where to split
        parse_log(REAL)
    cmds = re.search(r"\((head -n \d+ \S+ > run1\.log; tail -n \+\d+ \S+ > run2\.log)\)", str(err.value))
    assert cmds is not None, str(err.value)
    shutil.copy(REAL, tmp_path / REAL.name)
    subprocess.run(["bash", "-c", cmds.group(1)], cwd=tmp_path, check=True)
    one, two = parse_log(tmp_path / "run1.log"), parse_log(tmp_path / "run2.log")
    logs = parse_logs(REAL)
    assert len(logs) == 2 and same(logs[0], one) and same(logs[1], two)
    assert [(lg.op, lg.nodes, lg.nranks, len(lg.rows), lg.run) for lg in logs] == [
        ("all_reduce", 10, 10, 10, (1, 1, 35)), ("all_gather", 10, 10, 10, (2, 38, 75))
    ]
    assert logs[1].name == "h100xx_n10_g1_multi_run.log (run 2, lines 38-75)"
    # a file of one run: the same log parse_log gives, no run index
    assert parse_logs(tmp_path / "run1.log") == [one] and one.run is None


def test_cli_calibrates_on_the_real_file_as_on_its_two_halves(cli, tmp_path):
    """Through the real entry point: exit 0, one note naming the runs, the all_gather run left out the way
    a separate all_gather file is, the same fit and predictions as the hand-split files; --compare on a
    file of several runs compares the runs of the predicted collective."""
    held = tmp_path / "held" / REAL.name  # a copy: a file given to both options is refused (audit 17 A2 #1)
    held.parent.mkdir()
    held.write_bytes(REAL.read_bytes())
    r = cli(
        "collective", "--calibrate", str(REAL), "--compare", str(held), "--nodes", "10", "--sizes", "1G",
        "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    err = r.stderr.splitlines()
    runs = [x for x in err if "2 nccl-tests runs" in x]
    assert runs == [
        "note: h100xx_n10_g1_multi_run.log: 2 nccl-tests runs, each read as one log: all_reduce lines 1-35 "
        "(10 ranks on 10 nodes), all_gather lines 38-75 (10 ranks on 10 nodes)"
    ] * 2  # once for --calibrate, once for --compare
    assert any("left out h100xx_n10_g1_multi_run.log (run 2, lines 38-75: all_gather)" in x for x in err)
    assert any("compared its all_reduce runs only, leaving out lines 38-75 (all_gather)" in x for x in err)
    compared = "compared with 9 measured rows (32 MB-8 GB) of 1 run(s) in 1 file(s)"
    assert any(x.startswith(compared) for x in err)
    # the library on the two hand-split files gives the same fit
    split = [write(tmp_path, "run1.log", RUN1), write(tmp_path, "run2.log", RUN2)]
    fit = calibrate_cluster(load_cluster("dgx-h100-ib"), split, op="all_reduce")
    assert next(x for x in err if x.startswith("calibrated on")) == fit.summary()
    whole = calibrate_cluster(load_cluster("dgx-h100-ib"), [REAL], op="all_reduce")
    assert whole.params == fit.params and whole.cluster.tuning.source.startswith(
        "fit:h100xx_n10_g1_multi_run.log (run 1, lines 1-35)"
    )
    assert json.loads(r.stdout)[0]["nodes"] == 10


def test_importer_reads_the_real_file_as_its_two_halves(cli, tmp_path):
    """``fabricpace import nccl-tests`` on the file: one group per run, the rows of the two hand-split files
    imported as a folder (the same op, sizes, times, in order)."""
    r = cli("import", "nccl-tests", str(REAL), "-o", str(tmp_path / "whole"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("2 nccl-tests runs, each read as one log") == 1
    folder = tmp_path / "halves"
    folder.mkdir()
    write(folder, "run1.log", RUN1), write(folder, "run2.log", RUN2)
    halves = load_run(import_nccl_tests(folder, tmp_path / "split")).collectives.sort("rank", "seq")
    whole = load_run(tmp_path / "whole").collectives.sort("rank", "seq")
    assert whole.drop("group").equals(halves.drop("group")) and whole.height == 10 * 20
    assert whole.filter(pl.col("rank") == 0)["group"].unique(maintain_order=True).to_list() == [
        "h100xx_n10_g1_multi_run.log (run 1, lines 1-35)", "h100xx_n10_g1_multi_run.log (run 2, lines 38-75)"
    ]


def test_three_runs_and_a_repeated_measurement_count_as_separate_files_do(tmp_path):
    """all_reduce, all_gather, all_reduce again (10% slower): three logs; calibration on all_reduce uses
    both all_reduce runs, as it uses two separate files of one op and node count. A byte-identical repeat
    is counted once, as the same file given twice is."""
    two, third = "".join(LINES[35:74]), slower(RUN1, 1.1)  # run 2 without the copy's closing comment
    p = write(tmp_path, "sweep.log", RUN1 + two + third)
    logs = parse_logs(p)
    assert [(lg.op, lg.run) for lg in logs] == [
        ("all_reduce", (1, 1, 35)), ("all_gather", (2, 38, 72)), ("all_reduce", (3, 75, 109))
    ]
    assert same(logs[2], parse_log(write(tmp_path, "run3.log", third)))
    cluster = load_cluster("dgx-h100-ib")
    files = [write(tmp_path, f"run{i}.log", t) for i, t in enumerate((RUN1, two, third), start=1)]
    apart, together = (calibrate_cluster(cluster, x, op="all_reduce") for x in (files, [p]))
    assert together.params == apart.params and together.n_points == apart.n_points == 18
    twice = calibrate_cluster(cluster, [write(tmp_path, "twice.log", RUN1 + two + RUN1)], op="all_reduce")
    assert twice.n_points == 9 and any(
        "(run 3, lines 75-109): the same measurements as twice.log (run 1, lines 1-35); counted once" in x
        for x in twice.input_notes
    )


def test_a_broken_run_is_refused_at_its_line_in_the_original_file(cli, tmp_path):
    """A bad row in the second run names its line in the whole file (62), through the CLI in one line; a
    run whose ranks are spread unevenly is refused at its own rank line (the check at the end of a log runs
    on every run, not only the last)."""
    bad = LINES.copy()
    bad[61] = bad[61].replace("5217.67", "5217.6x7")  # line 62, inside the all_gather table
    p = write(tmp_path, "bad.log", "".join(bad))
    r = cli("collective", "--calibrate", str(p), "--op", "all_gather")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{p}:62: cannot read a number" in lines[0]
    uneven = LINES.copy()
    uneven[14] = uneven[14].replace("cnode3-011", "cnode3-010")  # run 1's rank 9 on rank 8's host
    with pytest.raises(ParseError, match=r"uneven\.log:14: ranks are spread unevenly"):
        parse_logs(write(tmp_path, "uneven.log", "".join(uneven)))


def test_a_run_that_failed_before_any_row_is_refused_at_its_failure_line(tmp_path):
    """A sweep whose second run failed after its header: not dropped, refused at the failure's line."""
    head = LINES[35:53]  # run 2 up to its last rank line (line 53 of the file)
    fail = "cnode3-002: Test NCCL failure common.cu:1005 'unhandled system error'\n"
    p = write(tmp_path, "failed.log", RUN1 + "".join(head) + fail + RUN1)
    with pytest.raises(ParseError, match=r"failed\.log:54: the run whose header is at line 40 failed before"):
        parse_logs(p)


def test_nccl_tests_without_mpi_is_still_refused_in_one_line(cli, tmp_path):
    """Two processes of an nccl-tests built without MPI=1 print a header each before any row: not two
    runs. Through both commands that read logs, exit 2 and one line, as before."""
    g8 = (DATA / "h100ib290_n1_g8_all_reduce.log").read_text().splitlines()
    other = [x.replace("node005", "node007") for x in g8]
    both = g8[:3] + other[:3] + g8[3:11] + other[3:11] + g8[11:] + other[11:]
    p = write(tmp_path, "nompi.log", "\n".join(both))
    with pytest.raises(ParseError, match=r"nompi\.log:4: a second nccl-tests header.*make MPI=1"):
        parse_logs(p)
    r = cli("import", "nccl-tests", str(p), "-o", str(tmp_path / "out"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "nompi.log:4: a second nccl-tests header" in lines[0]
    assert not (tmp_path / "out").exists()
