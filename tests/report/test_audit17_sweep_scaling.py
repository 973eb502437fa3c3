"""Audit 17 L5: the report's Scaling table gave nccl-tests size sweeps step-time statistics ("mean
step 0.08 ms, efficiency 78%"), where a "step" is one message size of the sweep: a mean over sizes
means nothing. Now, as ``diagnose`` does (metrics.size_sweep, its note), sweeps are left out of the
step-time table with a line saying why, and the Scaling section shows each sweep's time and bandwidth at
its sizes instead, per rank count.

data: tests/importers/data/n2_all_reduce.log, a real-format 8-rank (2 nodes) all_reduce_perf log of
1-4 MiB; the 4-rank (1 node) log is the same with ranks 4-7 and the times changed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabricpace.diagnose import diagnose
from fabricpace.importers.nccl_tests import import_nccl_tests
from fabricpace.report import data as rd
from fabricpace.report.html import render_report
from fabricpace.run import load_run

N2_LOG = Path(__file__).parents[1] / "importers" / "data" / "n2_all_reduce.log"
N1_TIMES = {"93.25   11.24   21.08": "60.10   17.45   26.17",
            "94.22   22.26   41.73": "70.00   29.96   44.94",
            "110.9   37.82   70.91": "90.00   46.60   69.90"}


def _n1_log(path: Path) -> Path:
    lines = [line for line in N2_LOG.read_text().splitlines()
             if not (line.startswith("#  Rank") and int(line.split()[2]) >= 4)]
    text = "\n".join(lines).replace("-np 8", "-np 4")
    for a, b in N1_TIMES.items():
        text = text.replace(a, b)
    path.write_text(text + "\n")
    return path


@pytest.fixture
def sweeps(tmp_path: Path) -> tuple[Path, Path]:
    n1 = import_nccl_tests(_n1_log(tmp_path / "n1.log"), tmp_path / "n1")
    n2 = import_nccl_tests(N2_LOG, tmp_path / "n2")
    return n1, n2


def _text(fragment: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", fragment).split())


def test_sweeps_get_no_step_time_scaling(sweeps: tuple[Path, Path]) -> None:
    html = render_report(list(sweeps), findings=False)
    sec = html[html.index('<h2 id="scaling">'):]
    sec = sec[:sec.index("<h2", 5)]
    text = _text(sec)
    heads = [_text(h) for h in re.findall(r"<th[^>]*>.*?</th>", sec)]
    assert "mean step (ms)" not in heads and "efficiency" not in heads  # no step-time statistics of sizes
    assert 'class="scaling"' not in sec
    assert "size sweep" in text and "one step per message size" in text  # the one line saying why
    # per size, each rank count's time and bandwidth: n2's 4 MiB row is the log's 110.9 us, 37.82 GB/s
    # algbw (bytes / time, as diagnose's metrics.size_sweep) and 70.91 GB/s busbw (the log's)
    assert "4 MiB" in text
    row = next(_text(r) for r in re.findall(r"<tr>.*?</tr>", sec) if "4 MiB" in r)
    assert "0.090" in row and "46.60" in row and "69.90" in row  # n1: 4 ranks
    assert "0.111" in row and "37.82" in row and "70.91" in row  # n2: 8 ranks
    assert "sweep-fig" in sec


def test_sweep_numbers_are_diagnoses(sweeps: tuple[Path, Path]) -> None:
    for path in sweeps:
        run = load_run(path, tables=("ranks", "steps", "collectives"))
        rows = rd.size_sweep_rows(run, path.name)
        said = diagnose([path]).to_dict()["runs"][0]["metrics"]["size_sweep"]
        assert rows["bytes"].to_list() == [r["bytes"] for r in said]
        assert rows["time_ms"].to_list() == pytest.approx([r["time_ms"] for r in said])
        assert rows["algbw_gbytes_s"].to_list() == pytest.approx([r["algbw_gbytes_s"] for r in said])


def test_training_runs_keep_their_table_beside_a_sweep(sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

    small = write_synthetic(tmp_path / "t4", SynthSpec(ranks=4, gpus_per_node=4, steps=30))
    big = write_synthetic(tmp_path / "t8", SynthSpec(ranks=8, gpus_per_node=4, steps=30))
    html = render_report([small, big, sweeps[1]], findings=False)
    sec = html[html.index('<h2 id="scaling">'):]
    sec = sec[:sec.index("<h2", 5)]
    table = sec[sec.index('<table class="scaling">'):]
    table = table[:table.index("</table>")]
    assert "t4" in table and "t8" in table and "n2" not in table  # the sweep is not in the step table
    note = _text(sec)
    assert "n2" in note and "size sweep" in note and "4 MiB" in note
