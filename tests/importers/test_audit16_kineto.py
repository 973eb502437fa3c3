"""Audit 16 (Kineto import): step components inside their step, data time out of compute, gloo
arrivals at issue, ranks missing from an import, traces of different runs.

data/gloo_buckets and data/gloo_buckets_straggler are real torch.profiler traces of a 4-rank gloo DDP
job with three buckets a step (data/make_gloo_buckets_traces.py says how they were made): rank 2 sleeps
30 ms before forward in both; in gloo_buckets rank 1 also waits 20 ms a step in its DataLoader.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from fabricpace.importers.kineto import import_kineto
from fabricpace.run import load_run

DATA = Path(__file__).parent / "data"
BUCKETS = DATA / "gloo_buckets"
STRAGGLER = DATA / "gloo_buckets_straggler"


def _steps(run_dir: Path) -> pl.DataFrame:
    run = load_run(run_dir, all_steps=True)
    return run.steps.with_columns((pl.col("t_end_ns") - pl.col("t_start_ns")).alias("dur"))


def _union_inside(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``spans`` cut to [lo, hi) (plain Python: an independent reckoning)."""
    cut = sorted((max(a, lo), min(b, hi)) for a, b in spans if min(b, hi) > max(a, lo))
    total, end = 0, None
    for a, b in cut:
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


@pytest.mark.parametrize("src", [STRAGGLER, BUCKETS], ids=["straggler", "straggler+data"])
def test_step_components_lie_inside_the_step(src: Path, tmp_path: Path) -> None:
    """Audit #1: a gloo span ending after ProfilerStep#N, merged with step N+1's first span, was charged
    whole to step N (wait 108.7 ms in a 51.8 ms step, 0 in the next). In gloo_buckets_straggler the old
    importer gave 2 of 32 rows wait > step (58.8 ms in a 57.4 ms step) and compute 0."""
    out = import_kineto(src, tmp_path / "run")
    s = _steps(out)
    assert s.height == 32
    assert (s["wait_ns"] >= 0).all() and (s["wait_ns"] <= s["comm_ns"]).all()
    assert (s["comm_ns"] <= s["dur"]).all()
    assert (s["compute_ns"] > 0).all()
    c = load_run(out, all_steps=True).collectives
    for row in s.iter_rows(named=True):  # comm = the step's own collectives, cut to the step
        own = c.filter((pl.col("rank") == row["rank"]) & (pl.col("step") == row["step"]))
        spans = list(zip(own["t_enter_ns"].to_list(), own["t_exit_ns"].to_list(), strict=True))
        assert row["comm_ns"] == _union_inside(spans, row["t_start_ns"], row["t_end_ns"])


def test_compute_leaves_out_data_loading(tmp_path: Path) -> None:
    """Audit #6: compute was step - wait, so data time was counted twice (rank 1: compute + wait +
    data = 149% of its steps; here 135% before the fix). Now compute = step - wait - data - gc."""
    s = _steps(import_kineto(BUCKETS, tmp_path / "run"))
    assert (s["compute_ns"] == s["dur"] - s["wait_ns"] - s["data_ns"] - s["gc_ns"]).all()
    per = s.group_by("rank").agg(
        ((pl.col("compute_ns") + pl.col("wait_ns") + pl.col("data_ns")).sum() / pl.col("dur").sum())
        .alias("share"),
        pl.col("data_ns").median().alias("data"),
        pl.col("dur").median().alias("dur"),
    ).sort("rank")
    assert per["share"].to_list() == pytest.approx([1.0] * 4, abs=1e-9)
    data = dict(zip(per["rank"].to_list(), per["data"].to_list(), strict=True))
    assert data[1] > 10 * max(data[0], data[2], data[3])  # the DataLoader's 20 ms sleep on rank 1


def _issue_starts(src: Path, rank: int) -> list[int]:
    """Absolute ns of rank's c10d::allreduce_ ops, read straight from its trace file."""
    (path,) = src.glob(f"rank{rank}.*")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    base = int(doc.get("baseTimeNanoseconds", 0))
    return sorted(
        base + round(e["ts"] * 1000)
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("name") == "c10d::allreduce_"
    )


def test_gloo_arrival_is_the_issuing_op(tmp_path: Path) -> None:
    """Audit #7: a bucket queued behind gloo's two busy worker threads got t_enter = when a thread
    took it up, so the straggler's lateness on the third bucket read -0.95 ms (issue-based: 25 ms).
    Here the old importer gave rank 2 lateness 27.6 / 27.1 / -1 ms per bucket."""
    out = import_kineto(STRAGGLER, tmp_path / "run")
    run = load_run(out, all_steps=True)
    origin = run.manifest.extra["origin_abs_ns"]
    c = run.collectives.sort("rank", "step", "t_enter_ns")
    for r in range(4):  # t_enter is the issuing op's start
        mine = c.filter(pl.col("rank") == r)
        assert sorted((mine["t_enter_ns"] + origin).to_list()) == _issue_starts(STRAGGLER, r)
    assert (c["t_exit_ns"] > c["t_enter_ns"]).all()
    c = c.with_columns(pl.int_range(pl.len()).over("rank", "step").alias("bucket"))
    others = c.filter(pl.col("rank") != 2).group_by("step", "bucket").agg(pl.col("t_enter_ns").max())
    late = (
        c.filter(pl.col("rank") == 2)
        .join(others, on=["step", "bucket"], suffix="_others")
        .group_by("bucket")
        .agg(((pl.col("t_enter_ns") - pl.col("t_enter_ns_others")) / 1e6).median().alias("ms"))
        .sort("bucket")
    )
    ms = late["ms"].to_list()
    assert len(ms) == 3
    assert min(ms) > 0.5 * max(ms) > 5  # every bucket shows the 30 ms straggler, the queued one too


def test_missing_rank_is_said_at_import_and_by_readers(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Audit #2: rank 2's trace missing from a 4-rank job was imported as '3 ranks' with no word, and
    diagnose blamed sync_amplification. Now the import says which ranks are missing (one stderr line)
    and every reader of the run (load_run, diagnose, report) warns."""
    src = tmp_path / "src"
    src.mkdir()
    for r in (0, 1, 3):
        for f in BUCKETS.glob(f"rank{r}.*"):
            shutil.copy(f, src / f.name)
    out = tmp_path / "run"
    r = cli("import", "kineto", str(src), "-o", str(out))
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "no trace" in line]
    assert len(notes) == 1 and "rank 2 of 4 has no trace" in notes[0] and "world_size" in notes[0]
    run = load_run(out)
    assert run.world_size == 3  # what the import holds; the job's size is in the manifest
    assert run.manifest.extra["job_world_size"] == 4
    said = [w for w in run.warnings if "rank 2 of 4 has no trace in this import" in w]
    assert len(said) == 1 and "culprit" in said[0]
    d = cli("diagnose", str(out))
    assert d.returncode == 0, d.stderr
    assert "rank 2 of 4 has no trace" in " ".join((d.stdout + d.stderr).split())
    j = cli("diagnose", str(out), "--format", "json")
    doc = json.loads(j.stdout)
    assert any("rank 2 of 4 has no trace" in w for w in doc["runs"][0]["warnings"])


def test_whole_job_gives_no_missing_rank_warning(tmp_path: Path) -> None:
    run = load_run(import_kineto(BUCKETS, tmp_path / "run"))
    assert not [w for w in run.warnings if "no trace in this import" in w]


def test_traces_of_two_runs_are_refused(cli, refused, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Audit #8: ranks 0-1 of one run and 2-3 of another (same world_size, same step numbers) were
    imported; diagnose then blamed 'fabricpace's collective wrapper'. Now refused, naming the files."""
    src = tmp_path / "src"
    src.mkdir()
    for r, folder in ((0, BUCKETS), (1, BUCKETS), (2, STRAGGLER), (3, STRAGGLER)):
        for f in folder.glob(f"rank{r}.*"):
            shutil.copy(f, src / f.name)
    before = sorted(p.name for p in src.iterdir())
    out = tmp_path / "out"
    r = cli("import", "kineto", str(src), "-o", str(out))
    line = refused(r, "traces of different runs", "ProfilerStep#", "rank 2", "rank 0",
                   "import one run at a time")
    assert next(STRAGGLER.glob("rank2.*")).name in line and next(BUCKETS.glob("rank0.*")).name in line
    assert not out.exists() and sorted(p.name for p in src.iterdir()) == before


def _shifted_copy(src: Path, dst: Path, rank: int, shift_ns: int) -> None:
    """A copy of src with rank's clock moved by shift_ns (its baseTimeNanoseconds, as another host's)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith(f"rank{rank}."):
            doc = json.loads(gzip.decompress(f.read_bytes()))
            doc["baseTimeNanoseconds"] = int(doc["baseTimeNanoseconds"]) + shift_ns
            (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
        else:
            shutil.copy(f, dst / f.name)


@pytest.mark.parametrize("shift_ms", [-8, 5, 120, 300])
def test_one_job_with_skewed_clocks_is_imported(shift_ms: int, tmp_path: Path) -> None:
    """Clock skew between hosts (milliseconds) and ranks a step or more apart (steps here ~55 ms) are
    one job: never refused (the limit is max(10 median steps, 1 s) on the median offset)."""
    _shifted_copy(BUCKETS, tmp_path / "src", 3, shift_ms * 1_000_000)
    assert load_run(import_kineto(tmp_path / "src", tmp_path / "run")).world_size == 4


def test_a_clock_far_off_is_refused(cli, refused, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _shifted_copy(BUCKETS, tmp_path / "src", 3, 30 * 1_000_000_000)
    r = cli("import", "kineto", str(tmp_path / "src"), "-o", str(tmp_path / "out"))
    refused(r, "traces of different runs", "rank 3", "30.0 s after")
    assert not (tmp_path / "out").exists()
