"""Perfetto export carries every column of the run's tables (audit 17 A4, finding 6).

``export perfetto`` built its args from fixed lists: the observer's ``gc_count`` (steps) and an
nccl-tests import's ``inplace_time_us``, ``algbw_gbps``, ``busbw_gbps`` (collectives) never reached the
trace, and nothing said so, although writers may add columns freely (docs/run-directory.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from fabricpace.importers.nccl_tests import import_nccl_tests
from fabricpace.report.perfetto import export_perfetto
from fabricpace.run import load_run

REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real"
NCCL_LOG = Path(__file__).parents[1] / "fabric" / "data" / "h100ib_n2_all_reduce.log"


def _events(trace: Path, cat: str) -> list[dict]:
    return [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == cat]


def test_observer_steps_keep_gc_count(tmp_path: Path) -> None:
    run = REAL / "healthy"  # 4 real gloo ranks: the observer's steps carry gc_count
    steps = load_run(run, all_steps=True).steps
    assert "gc_count" in steps.columns
    ev = _events(export_perfetto(run, tmp_path / "t.json"), "step")
    assert len(ev) == steps.height
    want = {(r["rank"], r["step"]): r["gc_count"] for r in steps.iter_rows(named=True)}
    assert {(e["pid"], e["args"]["step"]): e["args"]["gc_count"] for e in ev} == want
    # every non-time column of the table is in args, nothing shown twice
    assert set(ev[0]["args"]) == set(steps.columns) - {"rank", "t_start_ns", "t_end_ns"}


def test_imported_nccl_tests_collectives_keep_their_columns(tmp_path: Path) -> None:
    run = import_nccl_tests(NCCL_LOG, tmp_path / "imp")
    coll = load_run(run, all_steps=True).collectives
    extra = {"inplace_time_us", "algbw_gbps", "busbw_gbps"}
    assert extra <= set(coll.columns)
    ev = _events(export_perfetto(run, tmp_path / "t.json"), "collective")
    assert len(ev) == coll.height
    assert extra <= set(ev[0]["args"])
    got = sorted(e["args"]["busbw_gbps"] for e in ev)
    assert got == sorted(coll["busbw_gbps"].to_list())
    assert not {"rank", "op", "t_enter_ns", "t_exit_ns"} & set(ev[0]["args"])
    # the ops thread carries an op's own tags too (here: a synthetic ops table with a tag column)
    ops = pl.DataFrame({"rank": [0], "step": [0], "op": ["fwd"], "t_start_ns": [0], "dur_ns": [5],
                        "stage": [1]})
    from fabricpace.report.perfetto import _op_events

    assert _op_events(ops).row(0, named=True)["args"] == {"step": 0, "stage": 1}
