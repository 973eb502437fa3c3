"""An output path with a file where a folder must be is one line and exit 2, before any work.

``-o notes.txt/report.html`` (a typo, or a file named like the folder meant) used to end every verb
that writes with a NotADirectoryError traceback and exit 1 — for ``report`` and ``export`` only after
the whole run had been read. ``place --out`` into a folder that does not exist was a
FileNotFoundError traceback.
"""

from __future__ import annotations

import pytest

SIM = ("--cluster", "single-switch", "--workload", "bert-large", "--nodes", "2", "--steps", "30",
       "--warmup", "5")




@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("not a folder\n")
    return f


def test_report_export_import_refuse_an_output_under_a_file(cli, tmp_path, blocker, refused):
    run = tmp_path / "run"
    r = cli("simulate", "--cluster", "single-switch", "--workload", "bert-large", "--nodes", "2",
            "--steps", "30", "--warmup", "5", "--out", str(run))
    assert r.returncode == 0, r.stderr
    out = blocker / "report.html"
    refused(cli("report", str(run), "-o", str(out)), "--out", str(blocker), "is a file, not a folder")
    refused(cli("export", "perfetto", str(run), "-o", str(blocker / "t.json")), "is a file, not a folder")
    log = tmp_path / "n2_all_reduce.log"
    log.write_text((_data() / "n2_all_reduce.log").read_text())
    r = cli("import", "nccl-tests", str(log), "-o", str(blocker / "imported"))
    refused(r, "is a file, not a folder")
    assert blocker.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n2_all_reduce.log", "notes.txt", "run"]


def _data():
    from pathlib import Path

    return Path(__file__).parents[1] / "importers" / "data"


@pytest.mark.parametrize(
    "args",
    [
        ("demo", "--out", "{b}/demo"),
        ("lab", "run", "--backend", "local", "--out", "{b}/a/run"),
        ("simulate", *SIM, "--out", "{b}/sim"),
        ("study", *SIM, "--repeats", "1", "--no-figures", "--out", "{b}/study"),
        ("collective", "--nodes", "2", "--sizes", "1G", "--plot", "{b}/busbw.html"),
    ],
    ids=["demo", "lab-run", "simulate", "study", "collective-plot"],
)
def test_every_writing_verb_refuses_an_output_under_a_file(cli, blocker, args, refused):
    r = cli(*[a.format(b=blocker) for a in args])
    refused(r, str(blocker))
    assert blocker.read_text() == "not a folder\n"


def test_place_out_under_a_file_or_in_a_missing_folder_is_one_line(cli, tmp_path, blocker, refused):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("h0 slots=8 leaf=0\nh1 slots=8 leaf=1\nh2 slots=8 leaf=0\nh3 slots=8 leaf=1\n")
    base = ("place", "--cluster", "roce-leaf-spine-2to1", "--hosts", str(hosts), "--out")
    refused(cli(*base, str(blocker / "placed.txt")), "is a file, not a folder")
    refused(cli(*base, str(tmp_path / "missing" / "placed.txt")), "does not exist; create it first")
    assert not (tmp_path / "missing").exists()


def test_run_refuses_a_run_dir_under_a_file_before_starting_ranks(cli, tmp_path, blocker, refused):
    script = tmp_path / "train.py"
    marker = tmp_path / "ran"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    r = cli("run", "--nproc", "1", "--run-dir", str(blocker / "run"), "--", str(script))
    refused(r, "--run-dir", "is a file, not a folder")
    assert not marker.exists()  # before: the job ran, and its observers recorded nothing
