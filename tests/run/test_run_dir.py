"""Run-directory round trips, atomic chunks and truncation reporting on real files."""

from __future__ import annotations

import pytest

from fabricpace import RunDirError
from fabricpace.run import ChunkWriter, Manifest, RunWriter, load_run, write_manifest
from fabricpace.run.schema import STEP_COLUMNS
from fabricpace.run.window import WINDOW_FIELDS, WindowSummary


def _step_row(rank: int, step: int) -> dict:
    return dict(
        rank=rank,
        step=step,
        t_start_ns=step * 100,
        t_end_ns=step * 100 + 90,
        compute_ns=50,
        wait_ns=30,
        comm_ns=40,
        data_ns=5,
        gc_ns=0,
        paced_ns=0,
        samples=8,
    )


def test_chunk_writer_round_trip(tmp_path):
    write_manifest(tmp_path, Manifest(source="observer", world_size=2, nodes=1, gpus_per_node=2))
    for rank in range(2):
        w = ChunkWriter(tmp_path, "steps", rank)
        for step in range(5):
            w.append(**_step_row(rank, step))
            if step == 2:
                w.flush()
        w.flush()
    run = load_run(tmp_path)
    assert run.steps.height == 10
    assert set(STEP_COLUMNS) <= set(run.steps.columns)
    assert sorted(run.steps["step"].unique().to_list()) == list(range(5))
    assert any("did not close cleanly" in w for w in run.warnings)


def test_run_writer_marks_complete_and_dictionary_columns_decode(tmp_path):
    w = RunWriter(tmp_path, Manifest(source="sim", world_size=2, nodes=2, gpus_per_node=1))
    w.write(
        "collectives",
        dict(
            rank=[0, 1],
            step=[0, 0],
            seq=[0, 0],
            group=["dp", "dp"],
            op=["all_reduce"] * 2,
            bytes=[4, 4],
            t_enter_ns=[1, 2],
            t_exit_ns=[5, 5],
        ),
    )
    w.close()
    run = load_run(tmp_path)
    assert run.manifest.complete
    assert run.collectives["op"].to_list() == ["all_reduce", "all_reduce"]
    assert not [x for x in run.warnings if "close" in x]


def test_corrupt_chunk_is_reported_not_fatal(tmp_path):
    write_manifest(tmp_path, Manifest(source="observer", world_size=1, nodes=1, gpus_per_node=1))
    w = ChunkWriter(tmp_path, "steps", 0)
    w.append(**_step_row(0, 0))
    good = w.flush()
    assert good is not None
    (good.parent / "part-000001.parquet").write_bytes(b"PAR1 truncated")
    run = load_run(tmp_path)
    assert run.steps.height == 1
    assert any("unreadable chunk" in x for x in run.warnings)


def test_not_a_run_dir(tmp_path):
    with pytest.raises(RunDirError, match=r"no manifest\.json"):
        load_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunDirError, match="unreadable manifest"):
        load_run(tmp_path)


def test_window_summary_round_trip():
    values = {name: float(i) for i, name in enumerate(WINDOW_FIELDS)}
    s = WindowSummary.from_array(WindowSummary(**values).to_array())  # type: ignore[arg-type]
    assert s.to_array().tolist() == [float(i) for i in range(len(WINDOW_FIELDS))]


def test_load_run_reads_only_the_tables_and_steps_asked_for(tmp_path):
    """A study needs the steps table only; the collectives table (one row per rank, bucket and step)
    of a large run does not fit in memory, so it is read only when asked, and only the steps asked."""
    from fabricpace.sim import simulate

    run_dir = simulate("single-switch", "resnet-50", None, nodes=1, steps=12, seed=1, out_dir=tmp_path / "r")
    full = load_run(run_dir)
    assert full.collectives.height > 0 and full.steps.height > 0
    only_steps = load_run(run_dir, tables=("steps",))
    assert only_steps.steps.equals(full.steps) and only_steps.collectives.height == 0
    assert only_steps.collectives.columns == full.collectives.columns
    some = load_run(run_dir, tables=("collectives",), step_range=(5, 6)).collectives
    assert sorted(some["step"].unique().to_list()) == [5, 6]
    assert some.height == full.collectives.filter(full.collectives["step"].is_between(5, 6)).height
    with pytest.raises(ValueError, match="unknown table"):
        load_run(run_dir, tables=("stepz",))
