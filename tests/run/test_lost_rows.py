"""Rows lost from a run directory are named, and ranks are compared over the steps they all cover
(audit 15, findings 4 and 7).

The runs are real recorded runs (tests/diagnose/data/real) laid out as the observer writes them: one
folder per rank, a part every 50 steps. Before: a zero-byte collectives part of rank 0 turned a
healthy 2-rank run's ``sync_amplification`` into ``topology_contention``; a rank folder replaced by a
file, or a rank without rows, gave no warning at all; a run re-created without its first steps read
as a healthy shorter run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from fabricpace.diagnose import diagnose
from fabricpace.run import Manifest, RunWriter, load_run
from fabricpace.run.reader import StepChunks, common_steps

REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real"
PER = 50


def _observer_layout(name: str, dst: Path) -> Path:
    """A copy of recorded run ``name`` with its steps, collectives and ops in per-rank parts of
    ``PER`` steps, numbered from part-000000 (the observer's layout)."""
    shutil.copytree(REAL / name, dst)
    for table in ("steps", "collectives", "ops"):
        whole = dst / table / "all"
        if not whole.is_dir():
            continue
        tab = pq.read_table(next(whole.glob("part-*.parquet")))
        shutil.rmtree(dst / table)
        frame = pl.from_arrow(tab)
        assert isinstance(frame, pl.DataFrame)
        for rank in sorted(frame["rank"].unique().to_list()):
            mine = frame.filter(pl.col("rank") == rank)
            for k, lo in enumerate(range(0, int(mine["step"].max()) + 1, PER)):
                part = mine.filter(pl.col("step").is_between(lo, lo + PER - 1))
                path = dst / table / f"rank-{rank:05d}" / f"part-{k:06d}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(part.to_arrow().cast(tab.schema), path)
    return dst


def _said(warnings: list[str], *words: str) -> list[str]:
    return [w for w in warnings if all(x in w for x in words)]


COVERAGE_WORDS = ("cover different steps", "missing or unreadable", "start at step", "end at step",
                  "no steps rows", "no collectives rows", "manifest.extra.steps")


@pytest.mark.parametrize("name", sorted(p.name for p in REAL.iterdir()))
def test_whole_recorded_runs_give_no_coverage_warning(tmp_path: Path, name: str) -> None:
    run = _observer_layout(name, tmp_path / name)
    got = load_run(run)
    assert not [w for w in got.warnings if any(x in w for x in COVERAGE_WORDS)], got.warnings
    assert got.coverage is not None and got.coverage.excluded == []
    assert got.steps.height == load_run(REAL / name).steps.height  # nothing left out


def test_a_zero_byte_collectives_part_no_longer_changes_the_verdict(tmp_path: Path) -> None:
    whole = _observer_layout("audit15-eval-ckpt", tmp_path / "whole")  # 2 ranks, 300 steps
    lost = tmp_path / "lost"
    shutil.copytree(whole, lost)
    (lost / "collectives" / "rank-00000" / "part-000001.parquet").write_bytes(b"")  # steps 50..99
    before = diagnose(whole)
    after = diagnose(lost)
    # Before: rank 1's lone rows of steps 50..99 read as 50 slow transfers -> topology_contention.
    assert [f.mode for f in after.findings] == [f.mode for f in before.findings] == ["sync_amplification"]
    said = _said(after.runs[0].warnings, "cover different steps", "steps 50..99 left out for every rank")
    assert said and "steps 0..299 except steps 50..99" in said[0]
    assert _said(after.runs[0].warnings, "collectives of rank 0", "part-000001", "steps 50..99 lost")
    run = load_run(lost)
    for table in (run.steps, run.collectives):
        assert table.filter(pl.col("step").is_between(50, 99)).height == 0  # for every rank
        assert table.filter(pl.col("step") == 100)["rank"].unique().sort().to_list() == [0, 1]
    assert StepChunks(lost).read(40, 120).filter(pl.col("step").is_between(50, 99)).height == 0
    kept = load_run(lost, all_steps=True)
    assert kept.steps.filter(pl.col("step").is_between(50, 99)).height == 100  # there when asked for
    assert kept.warnings == run.warnings


def test_a_rank_folder_that_is_a_file_is_named(tmp_path: Path) -> None:
    run = _observer_layout("audit15-eval-ckpt", tmp_path / "run")
    shutil.rmtree(run / "steps" / "rank-00001")
    (run / "steps" / "rank-00001").write_text("x\n")
    got = load_run(run)
    said = _said(got.warnings, "no steps rows of rank 1", "steps/rank-00001 is not a folder", "ranks.parquet",
                 "describe the other ranks only")
    assert len(said) == 1, got.warnings
    # Step times are synchronized: rank 0's steps still describe the job (they are not left out).
    assert got.steps.height == 300
    d = diagnose(run)  # before: "2 ranks ... sync_amplification" from rank 0's steps, no warning
    assert said[0] in d.runs[0].warnings


def test_a_rank_without_collectives_leaves_the_arrival_modes_undecided(tmp_path: Path) -> None:
    """pause-rank3: rank 3 is a persistent straggler. Without its collectives the other ranks' arrivals
    read as plain sync_amplification (before); now no arrival-based finding is made."""
    run = _observer_layout("pause-rank3", tmp_path / "run")  # 4 ranks
    shutil.rmtree(run / "collectives" / "rank-00003")
    got = load_run(run)
    said = _said(got.warnings, "no collectives rows of rank 3", "no collectives/rank-00003 folder",
                 "collectives of every rank are left out")
    assert said, got.warnings
    assert got.collectives.height == 0 and got.steps.height == 4 * 240
    assert StepChunks(run).rows == 0 and StepChunks(run, all_steps=True).rows > 0
    d = diagnose(run)
    assert not d.findings, [(f.mode, f.culprits.ranks) for f in d.findings]
    assert {a.mode for a in d.abstained} >= {"sync_amplification", "persistent_straggler"}
    assert said[0] in d.runs[0].warnings
    reasons = {a.reason for a in d.abstained if a.mode == "persistent_straggler"}
    assert all(r.startswith("collectives left out: no collectives rows of rank 3") for r in reasons), reasons


def test_a_rank_whose_parts_are_all_unreadable_is_named(tmp_path: Path) -> None:
    run = _observer_layout("healthy", tmp_path / "run")  # 4 ranks
    for part in (run / "steps" / "rank-00003").iterdir():
        part.write_bytes(part.read_bytes()[:200])  # truncated
    got = load_run(run)
    assert _said(got.warnings, "no steps rows of rank 3", "its parts are unreadable"), got.warnings


def test_a_rank_that_stopped_early_limits_every_rank_to_the_common_steps(tmp_path: Path) -> None:
    run = _observer_layout("healthy", tmp_path / "run")  # 240 steps: parts 0..4
    for table in ("steps", "collectives"):
        for k in (3, 4):  # rank 1 killed: its last two parts never written
            (run / table / "rank-00001" / f"part-{k:06d}.parquet").unlink()
    assert common_steps(run) == (0, 149)
    got = load_run(run)
    assert got.steps["step"].max() == 149 and got.collectives["step"].max() == 149
    assert got.steps.height == 4 * 150
    assert _said(got.warnings, "steps of rank 1 end at step 149, the other ranks' at 239")
    assert _said(got.warnings, "steps 0..149; steps 150..239 left out for every rank")
    assert _said(got.warnings, "rank 1 has 150 step rows (0..149)", "manifest.extra.steps says 240")
    assert diagnose(run).runs[0].steps_used <= 150


def test_a_run_without_its_first_steps_is_named(tmp_path: Path) -> None:
    """What a run directory re-created under a running job held: every rank's rows from step 100 on,
    parts numbered on from 2, and a manifest that says 240 steps ran."""
    run = _observer_layout("healthy", tmp_path / "run")
    for table in ("steps", "collectives"):
        for part in run.glob(f"{table}/rank-*/part-00000[01].parquet"):
            part.unlink()
    got = load_run(run)
    assert _said(got.warnings, "ranks 0-3 have 140 step rows (100..239)", "manifest.extra.steps says 240",
                 "100 missing (before step 100)")
    assert _said(got.warnings, "steps of ranks 0-3: part-000000, part-000001 missing or unreadable",
                 "rows before step 100 lost")
    assert got.steps.height == 4 * 140  # every rank lost the same steps: nothing else is left out
    assert got.warnings == diagnose(run).runs[0].warnings[-len(got.warnings):]


def test_a_rank_that_starts_late_is_named_and_left_out_before(tmp_path: Path) -> None:
    run = _observer_layout("healthy", tmp_path / "run")
    for table in ("steps", "collectives"):
        for part in run.glob(f"{table}/rank-00002/part-000000.parquet"):
            part.write_bytes(b"PAR1")  # unreadable: steps 0..49 of rank 2
    got = load_run(run)
    assert got.common_steps == (50, 239)
    assert got.steps["step"].min() == 50 and got.collectives["step"].min() == 50
    assert _said(got.warnings, "steps 50..239; steps 0..49 left out for every rank")
    assert _said(got.warnings, "steps of rank 2: part-000000 missing or unreadable", "rows before step 50")


def test_a_folder_holding_every_rank_s_rows_is_not_read_as_one_rank(tmp_path: Path) -> None:
    """A writer may put several ranks' rows under one ``rank-NNNNN`` folder (tests/study does): the
    parts' rank statistics say so, and no rank is called missing."""
    w = RunWriter(tmp_path / "run", Manifest(source="sim", world_size=2, nodes=1, gpus_per_node=2))
    n = 10
    w.write("steps", {"rank": [0] * n + [1] * n, "step": list(range(n)) * 2,
                      "t_start_ns": list(range(2 * n)), "t_end_ns": list(range(1, 2 * n + 1))}
            | {c: [0] * 2 * n for c in ("compute_ns", "wait_ns", "comm_ns", "data_ns", "gc_ns", "paced_ns",
                                        "samples")}, rank=0)
    w.write("ranks", {"rank": [0, 1]} | {c: [None, None] for c in (
        "node", "local_rank", "host", "leaf", "dp_rank", "pp_stage", "tp_rank", "numa", "gpu", "nic",
        "clock_offset_ns", "clock_err_ns")})
    w.close()
    got = load_run(tmp_path / "run")
    assert got.steps.height == 2 * n and not [x for x in got.warnings if any(k in x for k in COVERAGE_WORDS)]


def test_a_perfetto_trace_keeps_the_steps_some_rank_lacks(tmp_path: Path) -> None:
    """Comparing ranks needs the steps they all cover; a trace shows what each rank did, so export
    keeps every row (it dropped rank 0's last 50 steps with rank 1's last part)."""
    import json

    from fabricpace.report.perfetto import export_perfetto

    run = _observer_layout("audit15-eval-ckpt", tmp_path / "run")
    last = sorted((run / "steps" / "rank-00001").glob("part-*.parquet"))[-1]
    last.unlink()
    assert load_run(run).steps["step"].max() < 250  # diagnosis and report: the common steps
    trace = export_perfetto(run, tmp_path / "trace.json")
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    steps = {e["args"]["step"] for e in events if e.get("cat") == "step" and e.get("pid") == 0}
    assert max(steps) == 299, max(steps)
